/* Encoding pipeline: split out added/special tokens, normalize each remaining segment
 * (utf8proc), escape spaces (SentencePiece), split into pre-tokens (PCRE2 regexes), and hand
 * each pre-token to the model (spm.c / bpe.c). Scratch memory is per call. */
#include "tok-impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tycho/errors.h"

#define SPM_SPACE "\xe2\x96\x81"

int ty__tok_ids_push(struct ty_tok_ids *ids, uint32_t id)
{
    if (ids->n == ids->cap) {
        size_t nc = ids->cap ? ids->cap * 2 : 64;
        uint32_t *nv = realloc(ids->v, nc * sizeof(uint32_t));
        if (!nv)
            return TY_ENOMEM;
        ids->v = nv;
        ids->cap = nc;
    }
    ids->v[ids->n++] = id;
    return 0;
}

const char *ty__tok_pre_regex(const char *pre)
{
    /* As llama.cpp's llm_tokenizer_bpe and the models' tokenizer.json files spell them. */
    static const char gpt2[] =
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
    static const char llama3[] =
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
        "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    static const char qwen2[] =
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
        "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    static const char o200k[] =
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
        "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    if (!pre || !strcmp(pre, "default") || !strcmp(pre, "gpt2") || !strcmp(pre, "gpt-2"))
        return gpt2;
    if (!strcmp(pre, "llama3") || !strcmp(pre, "llama-bpe") || !strcmp(pre, "llama-v3") ||
        !strcmp(pre, "smaug-bpe"))
        return llama3;
    if (!strcmp(pre, "qwen2") || !strcmp(pre, "deepseek-r1-qwen") || !strcmp(pre, "qwen3"))
        return qwen2;
    if (!strcmp(pre, "gpt-4o") || !strcmp(pre, "o200k") || !strcmp(pre, "gpt-oss"))
        return o200k;
    return NULL;
}

/* Per-call state of one encode. */
struct enc {
    const struct ty_tokenizer *t;
    struct ty_tok_ids ids;
    char *buf; /* scratch for normalization / escaping */
    size_t buf_cap;
    pcre2_match_data *md;
};

static int scratch(struct enc *e, size_t n)
{
    if (n <= e->buf_cap)
        return 0;
    size_t c = e->buf_cap ? e->buf_cap : 256;
    while (c < n)
        c *= 2;
    char *nb = realloc(e->buf, c);
    if (!nb)
        return TY_ENOMEM;
    e->buf = nb;
    e->buf_cap = c;
    return 0;
}

static int model_encode(struct enc *e, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    if (e->t->model == TY_TOK_MODEL_SPM)
        return ty__tok_spm_encode(e->t, s, n, &e->ids);
    return ty__tok_bpe_encode(e->t, s, n, &e->ids);
}

/* Split s by regex `level` and the ones after it (HF Split, behaviour Isolated: matches and
 * the gaps between them are all pre-tokens). */
static int split_regex(struct enc *e, uint32_t level, const char *s, size_t n)
{
    const struct ty_tokenizer *t = e->t;
    if (level >= t->n_re)
        return model_encode(e, s, n);
    size_t pos = 0, last = 0;
    int rc;
    while (pos < n) {
        int m = pcre2_match(t->re[level], (PCRE2_SPTR)s, n, pos, 0, e->md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0)
            return TY_ETOKENIZER;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t a = ov[0], b = ov[1];
        if (b == a) { /* empty match: step one character */
            pos = a + ty__tok_utf8_len((const unsigned char *)s + a, n - a);
            continue;
        }
        if (a > last && (rc = split_regex(e, level + 1, s + last, a - last)))
            return rc;
        if ((rc = split_regex(e, level + 1, s + a, b - a)))
            return rc;
        last = pos = b;
    }
    if (last < n)
        return split_regex(e, level + 1, s + last, n - last);
    return 0;
}

/* Metaspace split: pre-tokens begin at each "▁". */
static int split_metaspace(struct enc *e, const char *s, size_t n)
{
    size_t start = 0;
    for (size_t i = 1; i + 3 <= n; i++) {
        if (memcmp(s + i, SPM_SPACE, 3) == 0) {
            int rc = model_encode(e, s + start, i - start);
            if (rc)
                return rc;
            start = i;
            i += 2;
        }
    }
    return model_encode(e, s + start, n - start);
}

static utf8proc_option_t norm_flags(enum ty_tok_norm n)
{
    switch (n) {
    case TY_TOK_NORM_NFC:
        return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    case TY_TOK_NORM_NFKC:
        return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    case TY_TOK_NORM_NFD:
        return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    case TY_TOK_NORM_NFKD:
        return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    default:
        return 0;
    }
}

/* SentencePiece escaping into e->buf: optional leading "▁", every ' ' as "▁". */
static int spm_escape(struct enc *e, const char *s, size_t n, bool prefix, size_t *out_n)
{
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++)
        spaces += s[i] == ' ';
    int rc = scratch(e, n + 2 * spaces + 4);
    if (rc)
        return rc;
    size_t w = 0;
    if (prefix) {
        memcpy(e->buf, SPM_SPACE, 3);
        w = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(e->buf + w, SPM_SPACE, 3);
            w += 3;
        } else {
            e->buf[w++] = s[i];
        }
    }
    *out_n = w;
    return 0;
}

/* One segment of text between special tokens. */
static int encode_segment(struct enc *e, const char *s, size_t n, bool at_start)
{
    const struct ty_tokenizer *t = e->t;
    utf8proc_uint8_t *normed = NULL;
    int rc = 0;
    if (n == 0)
        return 0;
    if (t->norm != TY_TOK_NORM_NONE) {
        utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n,
                                          &normed, norm_flags(t->norm));
        if (m >= 0) { /* invalid UTF-8 is tokenized as it is */
            s = (const char *)normed;
            n = (size_t)m;
        }
    }
    if (t->escape_spaces) {
        bool prefix = t->add_space_prefix && (!t->prefix_first_only || at_start);
        size_t m;
        if ((rc = spm_escape(e, s, n, prefix, &m)))
            goto out;
        rc = t->metaspace_split ? split_metaspace(e, e->buf, m) : model_encode(e, e->buf, m);
    } else if (t->bytelevel_prefix_space && at_start && s[0] != ' ') {
        if (!(rc = scratch(e, n + 1))) {
            e->buf[0] = ' ';
            memcpy(e->buf + 1, s, n);
            rc = split_regex(e, 0, e->buf, n + 1);
        }
    } else {
        rc = split_regex(e, 0, s, n);
    }
out:
    free(normed);
    return rc;
}

/* Longest special token starting at s (control ones only when parse_special), or NULL. */
static const struct ty_tok_special *match_special(const struct ty_tokenizer *t, const char *s,
                                                  size_t n, bool parse_special)
{
    unsigned char b = (unsigned char)s[0];
    for (uint32_t i = t->special_first[b]; i < t->special_first[b + 1]; i++) {
        const struct ty_tok_special *sp = &t->specials[i];
        if (sp->control && !parse_special)
            continue;
        if (sp->len <= n && memcmp(sp->text, s, sp->len) == 0)
            return sp; /* sorted longest first */
    }
    return NULL;
}

static int encode_all(struct enc *e, const char *text, size_t len, bool add_special,
                      bool parse_special)
{
    const struct ty_tokenizer *t = e->t;
    int rc;
    if (add_special && t->add_bos && t->bos_id >= 0 &&
        (rc = ty__tok_ids_push(&e->ids, (uint32_t)t->bos_id)))
        return rc;
    size_t seg = 0;
    for (size_t i = 0; i < len; i++) {
        if (t->special_first[(unsigned char)text[i]] ==
            t->special_first[(unsigned char)text[i] + 1])
            continue;
        const struct ty_tok_special *sp = match_special(t, text + i, len - i, parse_special);
        if (!sp)
            continue;
        if ((rc = encode_segment(e, text + seg, i - seg, seg == 0)) ||
            (rc = ty__tok_ids_push(&e->ids, sp->id)))
            return rc;
        i += sp->len - 1;
        seg = i + 1;
    }
    if ((rc = encode_segment(e, text + seg, len - seg, seg == 0)))
        return rc;
    if (add_special && t->add_eos && t->eos_id >= 0 &&
        (rc = ty__tok_ids_push(&e->ids, (uint32_t)t->eos_id)))
        return rc;
    return 0;
}

int ty_tokenizer_encode(const ty_tokenizer_t *t, const char *text, size_t len, bool add_special,
                        bool parse_special, uint32_t *ids, size_t max_ids)
{
    if (!t || (!text && len))
        return TY_EINVAL;
    struct enc e = {.t = t};
    int rc;
    if (t->n_re) {
        e.md = pcre2_match_data_create(4, NULL);
        if (!e.md)
            return TY_ENOMEM;
    }
    rc = encode_all(&e, text, len, add_special, parse_special);
    if (rc == 0) {
        if (e.ids.n > (size_t)INT32_MAX) {
            rc = TY_EOVERFLOW;
        } else {
            size_t k = e.ids.n < max_ids ? e.ids.n : max_ids;
            if (k)
                memcpy(ids, e.ids.v, k * sizeof(uint32_t));
            rc = (int)e.ids.n;
        }
    }
    pcre2_match_data_free(e.md);
    free(e.ids.v);
    free(e.buf);
    return rc;
}
