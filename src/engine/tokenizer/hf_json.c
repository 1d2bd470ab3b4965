/* Hugging Face tokenizer.json (+ tokenizer_config.json, chat_template.jinja) to a
 * ty_tokenizer_spec. Only the pieces Llama/Qwen/gpt-oss style tokenizers use are accepted;
 * anything else is TY_ENOTSUP naming the piece, and a malformed file is TY_EPARSE. */
#include "tok-impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tycho/errors.h"

#define SPM_SPACE "\xe2\x96\x81"

struct hf {
    struct ty_tokenizer_spec sp;
    const char **tokens;
    uint32_t *lens;
    int32_t *types;
    const char **merges;
    char *merge_buf;
    const char *regex[TY_TOK_MAX_REGEX];
    bool bytelevel, spm_like, have_post_bos;
    int32_t post_bos, post_eos;
    char *template_text;
    char *chat_config; /* JSON text kept by the tokenizer (see ty_tokenizer_chat_config) */
    char *eb;
    size_t el;
};

#define FAIL(h, code, ...)                                                                         \
    do {                                                                                           \
        snprintf((h)->eb, (h)->el, __VA_ARGS__);                                                   \
        return (code);                                                                             \
    } while (0)

static const char *jstr(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool jbool(json_t *o, const char *key, bool dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int load_vocab(struct hf *h, json_t *model, json_t *added)
{
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        FAIL(h, TY_EPARSE, "tokenizer.json: model.vocab is missing or not an object");
    uint64_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 24))
            FAIL(h, TY_EPARSE, "tokenizer.json: vocab entry \"%.40s\" has a bad id", k);
        if ((uint64_t)json_integer_value(v) + 1 > n)
            n = (uint64_t)json_integer_value(v) + 1;
    }
    size_t i;
    json_array_foreach(added, i, v)
    {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 24) ||
            !jstr(v, "content"))
            FAIL(h, TY_EPARSE, "tokenizer.json: added_tokens[%zu] lacks a valid id or content", i);
        if ((uint64_t)json_integer_value(id) + 1 > n)
            n = (uint64_t)json_integer_value(id) + 1;
    }
    if (n == 0)
        FAIL(h, TY_EPARSE, "tokenizer.json: empty vocabulary");
    h->tokens = calloc(n, sizeof(char *));
    h->lens = calloc(n, sizeof(uint32_t));
    h->types = calloc(n, sizeof(int32_t));
    if (!h->tokens || !h->lens || !h->types)
        FAIL(h, TY_ENOMEM, "out of memory");
    for (i = 0; i < n; i++) {
        h->tokens[i] = "";
        h->types[i] = TY_TOK_TYPE_UNUSED;
    }
    json_object_foreach(vocab, k, v)
    {
        uint32_t id = (uint32_t)json_integer_value(v);
        h->tokens[id] = k;
        h->lens[id] = (uint32_t)strlen(k);
        h->types[id] = TY_TOK_TYPE_NORMAL;
    }
    json_array_foreach(added, i, v)
    {
        uint32_t id = (uint32_t)json_integer_value(json_object_get(v, "id"));
        h->tokens[id] = jstr(v, "content");
        h->lens[id] = (uint32_t)json_string_length(json_object_get(v, "content"));
        h->types[id] = jbool(v, "special", false) ? TY_TOK_TYPE_CONTROL : TY_TOK_TYPE_USER_DEFINED;
    }
    h->sp.n_vocab = (uint32_t)n;
    h->sp.tokens = h->tokens;
    h->sp.token_lens = h->lens;
    h->sp.token_types = h->types;
    return 0;
}

static int load_merges(struct hf *h, json_t *model)
{
    json_t *m = json_object_get(model, "merges"), *v;
    size_t i, total = 0;
    if (!m)
        return 0;
    if (!json_is_array(m))
        FAIL(h, TY_EPARSE, "tokenizer.json: model.merges is not an array");
    json_array_foreach(m, i, v)
    {
        if (json_is_string(v))
            continue;
        if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_string(json_array_get(v, 0)) ||
            !json_is_string(json_array_get(v, 1)))
            FAIL(h, TY_EPARSE, "tokenizer.json: merges[%zu] is neither \"a b\" nor [a, b]", i);
        total += json_string_length(json_array_get(v, 0)) +
                 json_string_length(json_array_get(v, 1)) + 2;
    }
    h->merges = calloc(json_array_size(m) + 1, sizeof(char *));
    h->merge_buf = malloc(total + 1);
    if (!h->merges || !h->merge_buf)
        FAIL(h, TY_ENOMEM, "out of memory");
    size_t off = 0;
    json_array_foreach(m, i, v)
    {
        if (json_is_string(v)) {
            h->merges[i] = json_string_value(v);
            continue;
        }
        int w = sprintf(h->merge_buf + off, "%s %s", json_string_value(json_array_get(v, 0)),
                        json_string_value(json_array_get(v, 1)));
        h->merges[i] = h->merge_buf + off;
        off += (size_t)w + 1;
    }
    h->sp.merges = h->merges;
    h->sp.n_merges = (uint32_t)json_array_size(m);
    return 0;
}

static int load_model(struct hf *h, json_t *root)
{
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        FAIL(h, TY_EPARSE, "tokenizer.json: \"model\" is missing or not an object");
    const char *type = jstr(model, "type");
    if (!type && json_object_get(model, "merges"))
        type = "BPE";
    if (!type || strcmp(type, "BPE") != 0)
        FAIL(h, TY_ENOTSUP, "tokenizer.json: model type \"%s\" is not supported (only BPE)",
             type ? type : "?");
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added))
        FAIL(h, TY_EPARSE, "tokenizer.json: added_tokens is not an array");
    int rc = load_vocab(h, model, added);
    if (rc || (rc = load_merges(h, model)))
        return rc;
    if (json_is_number(json_object_get(model, "dropout")) &&
        json_number_value(json_object_get(model, "dropout")) > 0)
        FAIL(h, TY_ENOTSUP, "tokenizer.json: BPE dropout is not supported");
    const char *cs = jstr(model, "continuing_subword_prefix");
    const char *ew = jstr(model, "end_of_word_suffix");
    if ((cs && cs[0]) || (ew && ew[0]))
        FAIL(h, TY_ENOTSUP, "tokenizer.json: continuing_subword_prefix/end_of_word_suffix");
    h->sp.model = TY_TOK_MODEL_BPE;
    h->sp.ignore_merges = jbool(model, "ignore_merges", false);
    h->spm_like = jbool(model, "byte_fallback", false);
    const char *unk = jstr(model, "unk_token");
    if (unk) {
        for (uint32_t i = 0; i < h->sp.n_vocab; i++)
            if (strcmp(h->tokens[i], unk) == 0) {
                h->sp.unk_id = (int32_t)i;
                h->types[i] = TY_TOK_TYPE_UNKNOWN;
                break;
            }
    }
    return 0;
}

static int norm_one(struct hf *h, json_t *n)
{
    const char *type = jstr(n, "type");
    if (!type)
        FAIL(h, TY_EPARSE, "tokenizer.json: normalizer without a type");
    static const char *names[] = {"NFC", "NFKC", "NFD", "NFKD"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(type, names[i])) {
            h->sp.normalizer = (enum ty_tok_norm)(TY_TOK_NORM_NFC + i);
            return 0;
        }
    if (!strcmp(type, "Prepend")) {
        const char *p = jstr(n, "prepend");
        if (!p || strcmp(p, SPM_SPACE) != 0)
            FAIL(h, TY_ENOTSUP, "tokenizer.json: normalizer Prepend of \"%s\"", p ? p : "?");
        h->spm_like = true;
        h->sp.add_space_prefix = true;
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        const char *from = jstr(json_object_get(n, "pattern"), "String"), *to = jstr(n, "content");
        if (!from || !to || strcmp(from, " ") != 0 || strcmp(to, SPM_SPACE) != 0)
            FAIL(h, TY_ENOTSUP, "tokenizer.json: normalizer Replace other than \" \" -> \"\u2581\"");
        h->spm_like = true;
        return 0;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers"), *v;
        size_t i;
        if (!json_is_array(list))
            FAIL(h, TY_EPARSE, "tokenizer.json: normalizer Sequence without a list");
        json_array_foreach(list, i, v)
        {
            int rc = norm_one(h, v);
            if (rc)
                return rc;
        }
        return 0;
    }
    FAIL(h, TY_ENOTSUP, "tokenizer.json: normalizer \"%s\" is not supported", type);
}

static int add_regex(struct hf *h, const char *re)
{
    if (h->sp.n_pre_regexes >= TY_TOK_MAX_REGEX)
        FAIL(h, TY_ENOTSUP, "tokenizer.json: more than %d Split pre-tokenizers", TY_TOK_MAX_REGEX);
    h->regex[h->sp.n_pre_regexes++] = re;
    return 0;
}

static int pre_split(struct hf *h, json_t *p)
{
    json_t *pat = json_object_get(p, "pattern");
    const char *re = jstr(pat, "Regex"), *beh = jstr(p, "behavior");
    if (!re)
        FAIL(h, TY_ENOTSUP, "tokenizer.json: Split pre-tokenizer with a String pattern");
    if (jbool(p, "invert", false) || (beh && strcmp(beh, "Isolated") != 0))
        FAIL(h, TY_ENOTSUP, "tokenizer.json: Split behavior \"%s\"%s (only Isolated)",
             beh ? beh : "?", jbool(p, "invert", false) ? " inverted" : "");
    return add_regex(h, re);
}

static int pre_metaspace(struct hf *h, json_t *p)
{
    const char *r = jstr(p, "replacement"), *scheme = jstr(p, "prepend_scheme");
    if (r && strcmp(r, SPM_SPACE) != 0)
        FAIL(h, TY_ENOTSUP, "tokenizer.json: Metaspace replacement \"%s\"", r);
    h->spm_like = true;
    h->sp.add_space_prefix = scheme ? strcmp(scheme, "never") != 0
                                    : jbool(p, "add_prefix_space", true);
    h->sp.prefix_first_only = scheme && !strcmp(scheme, "first");
    h->sp.metaspace_split = jbool(p, "split", true);
    return 0;
}

static int pre_one(struct hf *h, json_t *p)
{
    const char *type = jstr(p, "type");
    if (!type)
        FAIL(h, TY_EPARSE, "tokenizer.json: pre_tokenizer without a type");
    if (!strcmp(type, "Split"))
        return pre_split(h, p);
    if (!strcmp(type, "Metaspace"))
        return pre_metaspace(h, p);
    if (!strcmp(type, "ByteLevel")) {
        h->bytelevel = true;
        h->sp.bytelevel_add_prefix = jbool(p, "add_prefix_space", false);
        if (jbool(p, "use_regex", true))
            return add_regex(h, ty__tok_pre_regex("gpt2"));
        return 0;
    }
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(p, "pretokenizers"), *v;
        size_t i;
        if (!json_is_array(list))
            FAIL(h, TY_EPARSE, "tokenizer.json: pre_tokenizer Sequence without a list");
        json_array_foreach(list, i, v)
        {
            int rc = pre_one(h, v);
            if (rc)
                return rc;
        }
        return 0;
    }
    FAIL(h, TY_ENOTSUP, "tokenizer.json: pre_tokenizer \"%s\" is not supported", type);
}

static int dec_one(struct hf *h, json_t *d)
{
    static const char *ok[] = {"ByteLevel", "Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"};
    const char *type = jstr(d, "type");
    if (!type)
        FAIL(h, TY_EPARSE, "tokenizer.json: decoder without a type");
    if (!strcmp(type, "ByteLevel"))
        h->bytelevel = true;
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(d, "decoders"), *v;
        size_t i;
        json_array_foreach(list, i, v)
        {
            int rc = dec_one(h, v);
            if (rc)
                return rc;
        }
        return 0;
    }
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        if (!strcmp(type, ok[i]))
            return 0;
    FAIL(h, TY_ENOTSUP, "tokenizer.json: decoder \"%s\" is not supported", type);
}

static int32_t find_token(const struct hf *h, const char *s)
{
    for (uint32_t i = h->sp.n_vocab; i-- > 0;)
        if (h->types[i] != TY_TOK_TYPE_NORMAL && strcmp(h->tokens[i], s) == 0)
            return (int32_t)i;
    for (uint32_t i = 0; i < h->sp.n_vocab; i++)
        if (strcmp(h->tokens[i], s) == 0)
            return (int32_t)i;
    return -1;
}

/* TemplateProcessing: special tokens before $A are BOS, after it EOS. */
static int load_post(struct hf *h, json_t *p)
{
    const char *type = jstr(p, "type");
    if (!p || json_is_null(p) || (type && !strcmp(type, "ByteLevel")))
        return 0;
    if (type && !strcmp(type, "Sequence")) { /* Llama-3: ByteLevel (offsets only), Template */
        json_t *sub;
        size_t k;
        int rc;
        json_array_foreach(json_object_get(p, "processors"), k, sub)
        {
            if ((rc = load_post(h, sub)))
                return rc;
        }
        return 0;
    }
    if (!type || strcmp(type, "TemplateProcessing") != 0)
        FAIL(h, TY_ENOTSUP, "tokenizer.json: post_processor \"%s\" is not supported",
             type ? type : "?");
    json_t *single = json_object_get(p, "single"), *v;
    size_t i;
    bool seen_seq = false;
    json_array_foreach(single, i, v)
    {
        json_t *st = json_object_get(v, "SpecialToken");
        if (json_object_get(v, "Sequence")) {
            seen_seq = true;
        } else if (st) {
            const char *name = jstr(st, "id");
            int32_t id = name ? find_token(h, name) : -1;
            if (id < 0)
                FAIL(h, TY_EPARSE, "tokenizer.json: post_processor names unknown token \"%s\"",
                     name ? name : "?");
            if (seen_seq)
                h->post_eos = id;
            else
                h->post_bos = id;
        }
    }
    h->have_post_bos = true;
    return 0;
}

static int parse_tokenizer_json(struct hf *h, json_t *root)
{
    int rc = load_model(h, root);
    json_t *n = json_object_get(root, "normalizer"), *p = json_object_get(root, "pre_tokenizer");
    json_t *d = json_object_get(root, "decoder");
    if (rc || (n && !json_is_null(n) && (rc = norm_one(h, n))) ||
        (p && !json_is_null(p) && (rc = pre_one(h, p))) ||
        (d && !json_is_null(d) && (rc = dec_one(h, d))) ||
        (rc = load_post(h, json_object_get(root, "post_processor"))))
        return rc;
    if (h->bytelevel && h->spm_like)
        FAIL(h, TY_ENOTSUP, "tokenizer.json: both ByteLevel and SentencePiece-style pieces");
    if (!h->bytelevel && !h->spm_like)
        FAIL(h, TY_ENOTSUP, "tokenizer.json: BPE that is neither byte-level nor byte-fallback");
    h->sp.byte_fallback = h->spm_like;
    h->sp.pre_regexes = h->regex;
    h->sp.no_pre_split = h->bytelevel && h->sp.n_pre_regexes == 0;
    for (uint32_t i = 0; h->spm_like && i < h->sp.n_vocab; i++) {
        const char *s = h->tokens[i];
        if (h->types[i] == TY_TOK_TYPE_NORMAL && h->lens[i] == 6 && !strncmp(s, "<0x", 3) &&
            s[5] == '>')
            h->types[i] = TY_TOK_TYPE_BYTE;
    }
    if (h->have_post_bos) {
        h->sp.add_bos = h->post_bos >= 0;
        h->sp.add_eos = h->post_eos >= 0;
        if (h->post_bos >= 0)
            h->sp.bos_id = h->post_bos;
        if (h->post_eos >= 0)
            h->sp.eos_id = h->post_eos;
    }
    return 0;
}

/* bos_token etc. are strings or {"content": ...} objects. */
static const char *tok_name(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        return jstr(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && n < (64 << 20) && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            size_t got = fread(buf, 1, (size_t)n, f);
            buf[got] = 0;
        }
    }
    fclose(f);
    return buf;
}

/* dir + "/" + name into out, or "" when it does not fit. */
static void join_path(char *out, size_t cap, const char *dir, const char *name)
{
    size_t dl = strlen(dir), nl = strlen(name);
    if (dl + nl + 2 > cap) {
        out[0] = 0;
        return;
    }
    memcpy(out, dir, dl);
    out[dl] = '/';
    memcpy(out + dl + 1, name, nl + 1);
}

/* The special_tokens_map transformers passes to a chat template: the SPECIAL_TOKENS_ATTRIBUTES
 * set in the config (AddedToken objects become their content), empty ones left out, plus the
 * extra_special_tokens names. */
static json_t *special_tokens_map(json_t *cfg)
{
    static const char *attrs[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                  "pad_token", "cls_token", "mask_token"};
    json_t *m = json_object();
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        const char *v = tok_name(cfg, attrs[i]);
        if (v && v[0])
            json_object_set_new(m, attrs[i], json_string(v));
    }
    json_t *extra = json_object_get(cfg, "extra_special_tokens"), *v, *list = json_array();
    const char *k;
    json_object_foreach(extra, k, v)
    {
        const char *t = tok_name(extra, k);
        if (t && t[0])
            json_object_set_new(m, k, json_string(t));
    }
    size_t i;
    json_array_foreach(json_object_get(cfg, "additional_special_tokens"), i, v)
    {
        const char *t = json_is_object(v) ? jstr(v, "content") : json_string_value(v);
        if (t)
            json_array_append_new(list, json_string(t));
    }
    if (json_array_size(list))
        json_object_set_new(m, "additional_special_tokens", list);
    else
        json_decref(list);
    return m;
}

/* tokenizer_config.json "chat_template": a string, or a list of {name, template}. A
 * chat_template.jinja file beside it wins over both, as in transformers. */
static void load_templates(struct hf *h, json_t *cfg, json_t *chat)
{
    json_t *ct = json_object_get(cfg, "chat_template");
    if (h->template_text || !ct)
        return;
    if (json_is_string(ct)) {
        h->template_text = strdup(json_string_value(ct));
        return;
    }
    json_t *named = json_object(), *v;
    const char *tmpl = NULL;
    size_t i;
    json_array_foreach(ct, i, v)
    {
        const char *name = jstr(v, "name"), *text = jstr(v, "template");
        if (!name || !text)
            continue;
        json_object_set_new(named, name, json_string(text));
        if (!tmpl || !strcmp(name, "default"))
            tmpl = text;
    }
    if (tmpl)
        h->template_text = strdup(tmpl);
    json_object_set_new(chat, "templates", named);
}

static int load_config(struct hf *h, const char *dir)
{
    char path[4200];
    join_path(path, sizeof(path), dir, "chat_template.jinja");
    h->template_text = read_text(path);
    join_path(path, sizeof(path), dir, "tokenizer_config.json");
    json_error_t je;
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je); /* model_max_length can be 1e30 */
    if (!cfg) {
        struct stat st;
        if (stat(path, &st) != 0)
            return 0; /* optional */
        FAIL(h, TY_EPARSE, "%s:%d: %s", path, je.line, je.text);
    }
    static const char *keys[3] = {"bos_token", "eos_token", "pad_token"};
    int32_t *dst[3] = {&h->sp.bos_id, &h->sp.eos_id, &h->sp.pad_id};
    for (int i = 0; i < 3; i++) {
        const char *name = tok_name(cfg, keys[i]);
        if (name && find_token(h, name) >= 0)
            *dst[i] = find_token(h, name);
    }
    if (json_is_boolean(json_object_get(cfg, "add_bos_token")))
        h->sp.add_bos = jbool(cfg, "add_bos_token", false);
    if (json_is_boolean(json_object_get(cfg, "add_eos_token")))
        h->sp.add_eos = jbool(cfg, "add_eos_token", false);
    json_t *chat = json_object();
    json_object_set_new(chat, "special_tokens", special_tokens_map(cfg));
    load_templates(h, cfg, chat);
    h->chat_config = json_dumps(chat, JSON_COMPACT);
    json_decref(chat);
    json_decref(cfg);
    return 0;
}

static void hf_free(struct hf *h)
{
    free(h->tokens);
    free(h->lens);
    free(h->types);
    free(h->merges);
    free(h->merge_buf);
    free(h->template_text);
    free(h->chat_config);
}

static int resolve(const char *path, char *file, size_t fl, char *dir, size_t dl)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return TY_ENOENT;
    if (S_ISDIR(st.st_mode)) {
        join_path(file, fl, path, "tokenizer.json");
        snprintf(dir, dl, "%s", path);
        return stat(file, &st) == 0 ? 0 : TY_ENOENT;
    }
    snprintf(file, fl, "%s", path);
    snprintf(dir, dl, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, dl, ".");
    return 0;
}

/* Everything after the JSON parse; `dir` (or NULL) holds tokenizer_config.json. */
static int build_from_root(struct hf *h, json_t *root, const char *file, const char *dir,
                           ty_tokenizer_t **out)
{
    int rc = json_is_object(root) ? 0 : TY_EPARSE;
    if (rc)
        snprintf(h->eb, h->el, "%s: not a JSON object", file);
    if (!rc)
        rc = parse_tokenizer_json(h, root);
    if (!rc && dir)
        rc = load_config(h, dir);
    if (!rc) {
        h->sp.chat_template = h->template_text;
        rc = ty_tokenizer_new(out, &h->sp, h->eb, h->el);
    }
    if (!rc && h->chat_config) { /* the tokenizer frees it */
        (*out)->chat_config = h->chat_config;
        h->chat_config = NULL;
    }
    return rc;
}

int ty_tokenizer_load_json(ty_tokenizer_t **out, const char *path, char *eb, size_t el)
{
    char file[4096], dir[4096], dummy[8];
    struct hf h = {.eb = eb && el ? eb : dummy, .el = eb && el ? el : sizeof(dummy)};
    h.sp.bos_id = h.sp.eos_id = h.sp.unk_id = h.sp.pad_id = -1;
    h.post_bos = h.post_eos = -1;
    *out = NULL;
    if (resolve(path, file, sizeof(file), dir, sizeof(dir)))
        FAIL(&h, TY_ENOENT, "%s: no such file, nor a directory holding tokenizer.json", path);
    json_error_t je;
    json_t *root = json_load_file(file, JSON_ALLOW_NUL, &je);
    if (!root)
        FAIL(&h, TY_EPARSE, "%s:%d:%d: %s", file, je.line, je.column, je.text);
    int rc = build_from_root(&h, root, file, dir, out);
    json_decref(root);
    hf_free(&h);
    return rc;
}

int ty_tokenizer_load_json_buf(ty_tokenizer_t **out, const char *json, size_t len, char *eb,
                               size_t el)
{
    char dummy[8];
    struct hf h = {.eb = eb && el ? eb : dummy, .el = eb && el ? el : sizeof(dummy)};
    h.sp.bos_id = h.sp.eos_id = h.sp.unk_id = h.sp.pad_id = -1;
    h.post_bos = h.post_eos = -1;
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    if (!root)
        FAIL(&h, TY_EPARSE, "tokenizer.json:%d:%d: %s", je.line, je.column, je.text);
    int rc = build_from_root(&h, root, "tokenizer.json", NULL, out);
    json_decref(root);
    hf_free(&h);
    return rc;
}


const char *ty_tokenizer_chat_config(const ty_tokenizer_t *tok) { return tok->chat_config; }
