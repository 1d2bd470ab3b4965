/* A tokenizer's chat template between the tokenizer and the Jinja interpreter, following
 * transformers' apply_chat_template (tokenization_utils_base.py and utils/chat_template_utils.py):
 *  - template choice: a --chat-template file; else chat_template.jinja, which replaces
 *    tokenizer_config.json's "chat_template"; for the list form, "tool_use" when tools are given
 *    and it exists, else "default"; else the GGUF's tokenizer.chat_template;
 *  - variables: special_tokens_map (strings), then messages, tools (None when not given),
 *    documents (None), add_generation_prompt, then the chat_template_kwargs members (transformers
 *    merges **special_tokens_map and **kwargs the same way: kwargs win).
 */
#include "tycho/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok-impl.h"
#include "tycho/errors.h"
#include "tycho/jinja.h"

struct ty_chat_tpl {
    const ty_tokenizer_t *tok;
    ty_jinja_t *main;     /* used without tools; NULL for a named list without "default" */
    ty_jinja_t *tool_use; /* a named list's "tool_use", or NULL */
    char *src;            /* source of `main` (else of `tool_use`) */
    json_t *specials;     /* special_tokens_map; deep-copied per render (refcounts are shared) */
};

static char *read_file(const char *path, char *err, size_t errlen, int *rc)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    *rc = TY_ENOENT;
    if (!f) {
        snprintf(err, errlen, "chat template %s: cannot open", path);
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        *rc = TY_EINVAL;
        if (n >= 0 && n < (16 << 20) && fseek(f, 0, SEEK_SET) == 0) {
            buf = malloc((size_t)n + 1);
            if (!buf)
                abort();
            size_t got = fread(buf, 1, (size_t)n, f);
            buf[got] = 0;
            *rc = 0;
        }
    }
    fclose(f);
    if (!buf)
        snprintf(err, errlen, "chat template %s: cannot read (or over 16 MiB)", path);
    return buf;
}

/* Jinja error text with its line, unless the message says it already. */
static void format_error(char *err, size_t errlen, const char *what,
                         const struct ty_jinja_error *je)
{
    if (je->line > 0 && !strstr(je->msg, "line"))
        snprintf(err, errlen, "%s: %s (line %d)", what, je->msg, je->line);
    else
        snprintf(err, errlen, "%s: %s", what, je->msg[0] ? je->msg : "error");
}

static int parse_one(ty_jinja_t **out, const char *src, const char *what, char *err, size_t errlen)
{
    struct ty_jinja_error je = {0};
    int rc = ty_jinja_parse(out, src, strlen(src), &je);
    if (rc)
        format_error(err, errlen, what, &je);
    return rc;
}

static void add_special(json_t *m, const char *key, const ty_tokenizer_t *tok, int32_t id)
{
    size_t len;
    const char *s = id >= 0 ? ty_tokenizer_token_text(tok, (uint32_t)id, &len) : NULL;
    if (s && len)
        json_object_set_new(m, key, json_stringn(s, len));
}

/* special_tokens_map from tokenizer_config.json; a GGUF has only the ids. */
static json_t *load_specials(const ty_tokenizer_t *tok, json_t *cfg)
{
    json_t *m = json_object_get(cfg, "special_tokens");
    if (json_is_object(m))
        return json_incref(m);
    m = json_object();
    add_special(m, "bos_token", tok, tok->bos_id);
    add_special(m, "eos_token", tok, tok->eos_id);
    add_special(m, "unk_token", tok, tok->unk_id);
    add_special(m, "pad_token", tok, tok->pad_id);
    return m;
}

/* The list form of "chat_template": parse "default" and "tool_use". */
static int parse_named(ty_chat_tpl_t *t, json_t *named, char *err, size_t errlen)
{
    const char *def = json_string_value(json_object_get(named, "default"));
    const char *tool = json_string_value(json_object_get(named, "tool_use"));
    if (!def && !tool) {
        snprintf(err, errlen,
                 "tokenizer_config.json: chat_template list has neither a "
                 "\"default\" nor a \"tool_use\" template");
        return TY_ENOENT;
    }
    int rc = def ? parse_one(&t->main, def, "chat template \"default\"", err, errlen) : 0;
    if (!rc && tool)
        rc = parse_one(&t->tool_use, tool, "chat template \"tool_use\"", err, errlen);
    if (!rc)
        t->src = strdup(def ? def : tool);
    return rc;
}

static int load_own(ty_chat_tpl_t *t, json_t *cfg, char *err, size_t errlen)
{
    json_t *named = json_object_get(cfg, "templates");
    if (json_is_object(named))
        return parse_named(t, named, err, errlen);
    const char *src = ty_tokenizer_chat_template(t->tok);
    if (!src) {
        snprintf(err, errlen, "the model has no chat template (give one with --chat-template)");
        return TY_ENOENT;
    }
    t->src = strdup(src);
    return parse_one(&t->main, src, "chat template", err, errlen);
}

int ty_chat_tpl_new(ty_chat_tpl_t **out, const ty_tokenizer_t *tok, const char *override_path,
                    char *err, size_t errlen)
{
    char dummy[8];
    if (!err || !errlen) {
        err = dummy;
        errlen = sizeof(dummy);
    }
    err[0] = 0;
    *out = NULL;
    ty_chat_tpl_t *t = calloc(1, sizeof(*t));
    if (!t)
        abort();
    t->tok = tok;
    const char *cfg_text = ty_tokenizer_chat_config(tok);
    json_t *cfg = cfg_text ? json_loads(cfg_text, 0, NULL) : NULL;
    int rc = 0;
    if (override_path) {
        t->src = read_file(override_path, err, errlen, &rc);
        if (!rc)
            rc = parse_one(&t->main, t->src, override_path, err, errlen);
    } else {
        rc = load_own(t, cfg, err, errlen);
    }
    if (!rc && !t->src)
        abort(); /* strdup out of memory */
    t->specials = load_specials(tok, cfg);
    json_decref(cfg);
    if (rc) {
        ty_chat_tpl_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void ty_chat_tpl_free(ty_chat_tpl_t *t)
{
    if (!t)
        return;
    ty_jinja_free(t->main);
    ty_jinja_free(t->tool_use);
    free(t->src);
    json_decref(t->specials);
    free(t);
}

/* The request or null for an optional member HF passes as None when absent. */
static json_t *opt_member(const json_t *req, const char *key)
{
    json_t *v = json_object_get(req, key);
    return v ? json_incref(v) : json_null();
}

/* Top-level variables for one render, or NULL with err. */
static json_t *make_vars(const ty_chat_tpl_t *t, const json_t *req, char *err, size_t errlen)
{
    json_t *msgs = json_object_get(req, "messages");
    json_t *kw = json_object_get(req, "chat_template_kwargs");
    if (!json_is_array(msgs)) {
        snprintf(err, errlen, "request: \"messages\" must be an array");
        return NULL;
    }
    if (kw && !json_is_object(kw) && !json_is_null(kw)) {
        snprintf(err, errlen, "request: \"chat_template_kwargs\" must be an object");
        return NULL;
    }
    json_t *vars = json_deep_copy(t->specials);
    json_t *agp = json_object_get(req, "add_generation_prompt");
    json_object_set_new(vars, "add_generation_prompt",
                        agp && !json_is_null(agp) ? json_incref(agp) : json_true());
    const char *k;
    json_t *v;
    json_object_foreach(kw, k, v)
    {
        if (strcmp(k, "messages") && strcmp(k, "tools") && strcmp(k, "documents"))
            json_object_set(vars, k, v);
    }
    json_object_set(vars, "messages", msgs);
    json_object_set_new(vars, "tools", opt_member(req, "tools"));
    json_object_set_new(vars, "documents", opt_member(req, "documents"));
    return vars;
}

int ty_chat_tpl_render(const ty_chat_tpl_t *t, const json_t *req, char **out, size_t *out_len,
                       char *err, size_t errlen)
{
    char dummy[8];
    if (!err || !errlen) {
        err = dummy;
        errlen = sizeof(dummy);
    }
    err[0] = 0;
    *out = NULL;
    *out_len = 0;
    if (!json_is_object(req)) {
        snprintf(err, errlen, "request: not a JSON object");
        return TY_EINVAL;
    }
    json_t *tools = json_object_get(req, "tools");
    const ty_jinja_t *j = tools && !json_is_null(tools) && t->tool_use ? t->tool_use : t->main;
    if (!j) {
        snprintf(err, errlen, "the model's chat templates have no \"default\": tools are required");
        return TY_EINVAL;
    }
    json_t *vars = make_vars(t, req, err, errlen);
    if (!vars)
        return TY_EINVAL;
    struct ty_jinja_error je = {0};
    int rc = ty_jinja_render(j, vars, out, out_len, &je);
    json_decref(vars);
    if (rc) {
        format_error(err, errlen, "chat template", &je);
        *out = NULL;
        *out_len = 0;
    }
    return rc;
}

const char *ty_chat_tpl_source(const ty_chat_tpl_t *t)
{
    return t->src;
}

int ty_chat_tpl_encode(const ty_chat_tpl_t *t, const char *text, size_t len, uint32_t *ids,
                       size_t max_ids)
{
    return ty_tokenizer_encode(t->tok, text, len, false, true, ids, max_ids);
}
