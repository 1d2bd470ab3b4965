/* Chat templates: each family's Jinja template rewritten as C for plain system / user /
 * assistant (/ tool) conversations. The output must equal what the Jinja template renders;
 * comments quote the template line each branch follows. Pure functions, any thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tycho/errors.h"
#include "tycho/tokenizer.h"

struct sb {
    char *s;
    size_t n, cap;
    bool oom;
};

static void sb_putn(struct sb *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1)
            c *= 2;
        char *ns = realloc(b->s, c);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_put(struct sb *b, const char *s)
{
    sb_putn(b, s ? s : "", s ? strlen(s) : 0);
}

static char *sb_done(struct sb *b, bool ok)
{
    if (!ok || b->oom) {
        free(b->s);
        return NULL;
    }
    if (!b->s)
        sb_putn(b, "", 0);
    return b->oom ? NULL : b->s;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Jinja `| trim` / Python str.strip(): whitespace when `only` is 0, else that one char. */
static void put_strip(struct sb *b, const char *s, size_t n, bool left, bool right, char only)
{
    size_t a = 0, e = n;
    while (left && a < e && (only ? s[a] == only : is_ws(s[a])))
        a++;
    while (right && e > a && (only ? s[e - 1] == only : is_ws(s[e - 1])))
        e--;
    sb_putn(b, s + a, e - a);
}

static bool role_is(const struct ty_chat_msg *m, const char *r)
{
    return m->role && strcmp(m->role, r) == 0;
}

static const char *content(const struct ty_chat_msg *m)
{
    return m->content ? m->content : "";
}

/* ---- llama-2 / mistral: [INST] ---- */

static bool render_llama2(struct sb *b, const struct ty_chat_msg *m, size_t n, const char *bos,
                          const char *eos)
{
    /* {% if messages[0]['role'] == 'system' %}{% set system_message = ... loop_messages = [1:] */
    const char *sys = "";
    if (n > 0 && role_is(&m[0], "system")) {
        sys = content(&m[0]);
        m++;
        n--;
    }
    for (size_t i = 0; i < n; i++) {
        bool user = role_is(&m[i], "user");
        if (user != (i % 2 == 0))
            return false; /* raise_exception('Conversation roles must alternate ...') */
        struct sb c = {0};
        if (i == 0 && sys[0]) { /* '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + content */
            sb_put(&c, "<<SYS>>\n");
            sb_put(&c, sys);
            sb_put(&c, "\n<</SYS>>\n\n");
        }
        sb_put(&c, content(&m[i]));
        if (c.oom) {
            free(c.s);
            return false;
        }
        if (user) { /* bos_token + '[INST] ' + content | trim + ' [/INST]' */
            sb_put(b, bos);
            sb_put(b, "[INST] ");
            put_strip(b, c.s, c.n, true, true, 0);
            sb_put(b, " [/INST]");
        } else if (role_is(&m[i], "assistant")) { /* ' ' + content | trim + ' ' + eos_token */
            sb_put(b, " ");
            put_strip(b, c.s, c.n, true, true, 0);
            sb_put(b, " ");
            sb_put(b, eos);
        }
        free(c.s);
    }
    return true;
}

static bool render_mistral(struct sb *b, const struct ty_chat_msg *m, size_t n, const char *bos,
                           const char *eos)
{
    /* Mistral-7B-Instruct v0.1: {{ bos_token }}{% for message in messages %}
     * user: '[INST] ' + content + ' [/INST]'; assistant: content + eos_token; roles alternate */
    sb_put(b, bos);
    for (size_t i = 0; i < n; i++) {
        bool user = role_is(&m[i], "user");
        if (user != (i % 2 == 0))
            return false;
        if (user) {
            sb_put(b, "[INST] ");
            sb_put(b, content(&m[i]));
            sb_put(b, " [/INST]");
        } else if (role_is(&m[i], "assistant")) {
            sb_put(b, content(&m[i]));
            sb_put(b, eos);
        } else {
            return false;
        }
    }
    return true;
}

/* ---- llama-3 ---- */

static bool render_llama3(struct sb *b, const struct ty_chat_msg *m, size_t n, bool gen,
                          const char *bos)
{
    /* '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>',
     * bos_token before the first */
    for (size_t i = 0; i < n; i++) {
        if (i == 0)
            sb_put(b, bos);
        sb_put(b, "<|start_header_id|>");
        sb_put(b, m[i].role);
        sb_put(b, "<|end_header_id|>\n\n");
        put_strip(b, content(&m[i]), strlen(content(&m[i])), true, true, 0);
        sb_put(b, "<|eot_id|>");
    }
    if (gen)
        sb_put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return true;
}

/* ---- chatml ---- */

static bool render_chatml(struct sb *b, const struct ty_chat_msg *m, size_t n, bool gen)
{
    for (size_t i = 0; i < n; i++) { /* '<|im_start|>' + role + '\n' + content + '<|im_end|>\n' */
        sb_put(b, "<|im_start|>");
        sb_put(b, m[i].role);
        sb_put(b, "\n");
        sb_put(b, content(&m[i]));
        sb_put(b, "<|im_end|>\n");
    }
    if (gen)
        sb_put(b, "<|im_start|>assistant\n");
    return true;
}

/* ---- qwen3 ---- */

static bool is_tool_response(const char *c)
{
    size_t l = strlen(c), a = strlen("<tool_response>"), z = strlen("</tool_response>");
    return l >= a && l >= z && !strncmp(c, "<tool_response>", a) &&
           !strcmp(c + l - z, "</tool_response>");
}

/* message.content.split('</think>'): content after the last </think> (.lstrip('\n')), and
 * reasoning = split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n'). */
static const char *qwen3_split(const char *c, const char **reason, size_t *reason_n)
{
    const char *first = strstr(c, "</think>"), *last = NULL;
    *reason = "";
    *reason_n = 0;
    if (!first)
        return c;
    for (const char *p = first; p; p = strstr(p + 1, "</think>"))
        last = p;
    size_t e = (size_t)(first - c);
    while (e > 0 && c[e - 1] == '\n')
        e--;
    const char *st = c;
    for (const char *p = strstr(c, "<think>"); p && p < c + e; p = strstr(p + 1, "<think>"))
        st = p + strlen("<think>");
    while (st < c + e && *st == '\n')
        st++;
    *reason = st;
    *reason_n = st < c + e ? (size_t)(c + e - st) : 0;
    const char *body = last + strlen("</think>");
    while (*body == '\n')
        body++;
    return body;
}

static void qwen3_assistant(struct sb *b, const char *c, bool last_turn, bool after_query)
{
    const char *reason;
    size_t rn;
    const char *body = qwen3_split(c, &reason, &rn);
    sb_put(b, "<|im_start|>assistant\n");
    /* {%- if loop.index0 > ns.last_query_index %}{%- if loop.last or reasoning_content %} */
    if (after_query && (last_turn || rn > 0)) {
        sb_put(b, "<think>\n"); /* + reasoning.strip('\n') + '\n</think>\n\n' + content */
        put_strip(b, reason, rn, true, true, '\n');
        sb_put(b, "\n</think>\n\n");
        while (*body == '\n')
            body++;
    }
    sb_put(b, body);
    sb_put(b, "<|im_end|>\n");
}

static bool render_qwen3(struct sb *b, const struct ty_chat_msg *m, size_t n, bool gen,
                         const struct ty_chat_opts *o)
{
    if (n > 0 && role_is(&m[0], "system")) {
        sb_put(b, "<|im_start|>system\n");
        sb_put(b, content(&m[0]));
        sb_put(b, "<|im_end|>\n");
    }
    size_t last_query = n ? n - 1 : 0; /* ns.last_query_index */
    for (size_t k = n; k-- > 0;) {
        if (role_is(&m[k], "user") && !is_tool_response(content(&m[k]))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const char *c = content(&m[i]);
        if (role_is(&m[i], "user") || (role_is(&m[i], "system") && i > 0)) {
            sb_put(b, "<|im_start|>");
            sb_put(b, m[i].role);
            sb_put(b, "\n");
            sb_put(b, c);
            sb_put(b, "<|im_end|>\n");
        } else if (role_is(&m[i], "assistant")) {
            qwen3_assistant(b, c, i + 1 == n, i > last_query);
        } else if (role_is(&m[i], "tool")) {
            if (i == 0 || !role_is(&m[i - 1], "tool"))
                sb_put(b, "<|im_start|>user");
            sb_put(b, "\n<tool_response>\n");
            sb_put(b, c);
            sb_put(b, "\n</tool_response>");
            if (i + 1 == n || !role_is(&m[i + 1], "tool"))
                sb_put(b, "<|im_end|>\n");
        }
    }
    if (gen) {
        sb_put(b, "<|im_start|>assistant\n");
        if (o && o->disable_thinking)
            sb_put(b, "<think>\n\n</think>\n\n");
    }
    return true;
}

/* ---- gpt-oss (harmony) ---- */

static bool render_gptoss(struct sb *b, const struct ty_chat_msg *m, size_t n, bool gen,
                          const struct ty_chat_opts *o)
{
    char today[16];
    const char *date = o && o->date ? o->date : NULL;
    if (!date) {
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(today, sizeof(today), "%Y-%m-%d", &tm); /* strftime_now("%Y-%m-%d") */
        date = today;
    }
    sb_put(b, "<|start|>system<|message|>You are ChatGPT, a large language model trained by "
              "OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: ");
    sb_put(b, date);
    sb_put(b, "\n\nReasoning: ");
    sb_put(b, o && o->reasoning_effort ? o->reasoning_effort : "medium");
    sb_put(b, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
              "every message.<|end|>");
    if (n > 0 && (role_is(&m[0], "system") || role_is(&m[0], "developer"))) {
        if (content(&m[0])[0]) { /* {%- if developer_message or tools %} */
            sb_put(b, "<|start|>developer<|message|># Instructions\n\n");
            sb_put(b, content(&m[0]));
            sb_put(b, "\n\n<|end|>");
        }
        m++;
        n--;
    }
    for (size_t i = 0; i < n; i++) {
        const char *c = content(&m[i]);
        if (role_is(&m[i], "assistant")) {
            if (strstr(c, "<|channel|>analysis<|message|>") ||
                strstr(c, "<|channel|>final<|message|>"))
                return false; /* raise_exception("You have passed a message containing ...") */
            sb_put(b, "<|start|>assistant<|channel|>final<|message|>");
            sb_put(b, c);
            sb_put(b, i + 1 == n && !gen ? "<|return|>" : "<|end|>");
        } else if (role_is(&m[i], "user")) {
            sb_put(b, "<|start|>user<|message|>");
            sb_put(b, c);
            sb_put(b, "<|end|>");
        } else if (role_is(&m[i], "tool")) {
            return false; /* "Message has tool role, but there was no previous ... tool call" */
        }
    }
    if (gen)
        sb_put(b, "<|start|>assistant");
    return true;
}

char *ty_chat_render_opts(enum ty_chat_family f, const struct ty_chat_msg *msgs, size_t n,
                          bool gen, const char *bos, const char *eos,
                          const struct ty_chat_opts *o)
{
    struct sb b = {0};
    bool ok;
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role)
            return NULL;
    switch (f) {
    case TY_CHAT_LLAMA2:
        ok = render_llama2(&b, msgs, n, bos, eos);
        break;
    case TY_CHAT_LLAMA3:
        ok = render_llama3(&b, msgs, n, gen, bos);
        break;
    case TY_CHAT_CHATML:
        ok = render_chatml(&b, msgs, n, gen);
        break;
    case TY_CHAT_MISTRAL:
        ok = render_mistral(&b, msgs, n, bos, eos);
        break;
    case TY_CHAT_GPTOSS:
        ok = render_gptoss(&b, msgs, n, gen, o);
        break;
    case TY_CHAT_QWEN3:
        ok = render_qwen3(&b, msgs, n, gen, o);
        break;
    default:
        ok = false;
    }
    return sb_done(&b, ok);
}

char *ty_chat_render(enum ty_chat_family f, const struct ty_chat_msg *msgs, size_t n, bool gen,
                     const char *bos, const char *eos)
{
    return ty_chat_render_opts(f, msgs, n, gen, bos, eos, NULL);
}

enum ty_chat_family ty_chat_detect(const char *t)
{
    if (!t)
        return TY_CHAT_NONE;
    if (strstr(t, "<|start|>") && strstr(t, "<|channel|>") && strstr(t, "<|message|>"))
        return TY_CHAT_GPTOSS;
    if (strstr(t, "<|im_start|>")) {
        if (strstr(t, "<think>") && strstr(t, "</think>"))
            return TY_CHAT_QWEN3;
        /* Qwen2/2.5 inject a default system prompt: not plain chatml */
        if (strstr(t, "You are a helpful assistant") || strstr(t, "You are Qwen"))
            return TY_CHAT_NONE;
        return TY_CHAT_CHATML;
    }
    if (strstr(t, "<|start_header_id|>") && strstr(t, "<|eot_id|>")) {
        /* Llama 3.1+ add a dated system header and tool blocks: not rendered here */
        if (strstr(t, "Cutting Knowledge Date") || strstr(t, "Environment: ipython"))
            return TY_CHAT_NONE;
        return TY_CHAT_LLAMA3;
    }
    if (strstr(t, "[INST]")) {
        if (strstr(t, "<<SYS>>"))
            return TY_CHAT_LLAMA2;
        if (strstr(t, "[SYSTEM_PROMPT]") || strstr(t, "[AVAILABLE_TOOLS]"))
            return TY_CHAT_NONE; /* newer Mistral formats */
        return TY_CHAT_MISTRAL;
    }
    return TY_CHAT_NONE;
}

static const struct {
    const char *name;
    enum ty_chat_family f;
} family_names[] = {
    {"llama-2", TY_CHAT_LLAMA2}, {"llama2", TY_CHAT_LLAMA2},   {"llama-3", TY_CHAT_LLAMA3},
    {"llama3", TY_CHAT_LLAMA3},  {"chatml", TY_CHAT_CHATML},   {"mistral", TY_CHAT_MISTRAL},
    {"gpt-oss", TY_CHAT_GPTOSS}, {"harmony", TY_CHAT_GPTOSS},  {"qwen3", TY_CHAT_QWEN3},
};

int ty_chat_family_parse(const char *name, enum ty_chat_family *out)
{
    for (size_t i = 0; name && i < sizeof(family_names) / sizeof(family_names[0]); i++) {
        if (strcmp(name, family_names[i].name) == 0) {
            *out = family_names[i].f;
            return 0;
        }
    }
    return TY_EINVAL;
}

const char *ty_chat_family_name(enum ty_chat_family f)
{
    for (size_t i = 0; i < sizeof(family_names) / sizeof(family_names[0]); i++)
        if (family_names[i].f == f)
            return family_names[i].name;
    return "none";
}
