/* Building a tokenizer from a spec: vocabulary hash, merge table, decoded pieces, special
 * tokens, pre-tokenizer regexes; plus the read-only accessors. */
#include "tok-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tycho/errors.h"

#define SPM_SPACE "\xe2\x96\x81" /* U+2581 "▁" */

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t c = 16;
    while (c < n * 2)
        c <<= 1;
    return c;
}

static const char *tok_text(const struct ty_tokenizer *t, uint32_t id)
{
    return t->text + t->text_off[id];
}

int32_t ty__tok_lookup(const struct ty_tokenizer *t, const char *s, size_t n)
{
    uint32_t mask = t->map.cap - 1;
    for (uint32_t i = (uint32_t)fnv1a(s, n) & mask;; i = (i + 1) & mask) {
        uint32_t v = t->map.slots[i];
        if (v == 0)
            return -1;
        uint32_t id = v - 1;
        if (t->text_len[id] == n && memcmp(tok_text(t, id), s, n) == 0)
            return (int32_t)id;
    }
}

/* Insert every token; on duplicate texts the lowest id wins (as llama.cpp's token_to_id). */
static int build_strmap(struct ty_tokenizer *t)
{
    t->map.cap = pow2_at_least(t->n_vocab);
    t->map.slots = calloc(t->map.cap, sizeof(uint32_t));
    if (!t->map.slots)
        return TY_ENOMEM;
    uint32_t mask = t->map.cap - 1;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        if (t->text_len[id] == 0)
            continue;
        const char *s = tok_text(t, id);
        uint32_t i = (uint32_t)fnv1a(s, t->text_len[id]) & mask;
        for (;; i = (i + 1) & mask) {
            uint32_t v = t->map.slots[i];
            if (v == 0) {
                t->map.slots[i] = id + 1;
                break;
            }
            if (t->text_len[v - 1] == t->text_len[id] && memcmp(tok_text(t, v - 1), s, t->text_len[id]) == 0)
                break;
        }
    }
    return 0;
}

static int merge_insert(struct ty_tokenizer *t, uint32_t l, uint32_t r, uint32_t rank, uint32_t res)
{
    uint64_t key = (((uint64_t)l << 32) | r) + 1;
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t i = (uint32_t)mix64(key) & mask;; i = (i + 1) & mask) {
        if (t->merges[i].key == key)
            return 0; /* the first (lowest rank) occurrence wins */
        if (t->merges[i].key == 0) {
            t->merges[i] = (struct ty_tok_merge){key, rank, res};
            return 0;
        }
    }
}

static int build_merges(struct ty_tokenizer *t, const struct ty_tokenizer_spec *sp, char *eb,
                        size_t el)
{
    if (sp->n_merges == 0)
        return 0;
    t->merge_cap = pow2_at_least(sp->n_merges);
    t->merges = calloc(t->merge_cap, sizeof(*t->merges));
    if (!t->merges)
        return TY_ENOMEM;
    char buf[1024];
    for (uint32_t i = 0; i < sp->n_merges; i++) {
        const char *m = sp->merges[i];
        const char *sp1 = m ? strchr(m, ' ') : NULL;
        if (!sp1) {
            snprintf(eb, el, "merge %u (\"%.40s\") is not \"left right\"", i, m ? m : "(null)");
            return TY_EINVAL;
        }
        size_t ll = (size_t)(sp1 - m), rl = strlen(sp1 + 1);
        int32_t l = ty__tok_lookup(t, m, ll), r = ty__tok_lookup(t, sp1 + 1, rl);
        if (l < 0 || r < 0 || ll + rl >= sizeof(buf))
            continue; /* HF rejects these; llama.cpp ignores them: skip */
        memcpy(buf, m, ll);
        memcpy(buf + ll, sp1 + 1, rl);
        int32_t res = ty__tok_lookup(t, buf, ll + rl);
        if (res < 0)
            continue;
        merge_insert(t, (uint32_t)l, (uint32_t)r, i, (uint32_t)res);
    }
    return 0;
}

/* ---- GPT-2 byte-to-unicode ---- */

static bool byte_is_printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
}

uint32_t ty__tok_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b))
        return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        n += !byte_is_printable(c);
    return 256 + n;
}

int ty__tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_is_printable(cp) ? (int)cp : -1;
    uint32_t n = cp - 256;
    for (unsigned c = 0; c < 256; c++) {
        if (!byte_is_printable(c) && n-- == 0)
            return (int)c;
    }
    return -1;
}

size_t ty__tok_utf8_len(const unsigned char *s, size_t n)
{
    size_t l = 1;
    if ((s[0] & 0xE0) == 0xC0)
        l = 2;
    else if ((s[0] & 0xF0) == 0xE0)
        l = 3;
    else if ((s[0] & 0xF8) == 0xF0)
        l = 4;
    return l < n ? l : n;
}

static size_t utf8_put(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    o[0] = (char)(0xE0 | (cp >> 12));
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

static uint32_t utf8_get(const unsigned char *s, size_t n, size_t *len)
{
    size_t l = ty__tok_utf8_len(s, n);
    *len = l;
    if (l == 1)
        return s[0];
    uint32_t cp = s[0] & (0xFF >> (l + 1));
    for (size_t i = 1; i < l; i++)
        cp = (cp << 6) | (s[i] & 0x3F);
    return cp;
}

static int parse_byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        unsigned d = (c >= '0' && c <= '9')   ? (unsigned)(c - '0')
                     : (c >= 'A' && c <= 'F') ? (unsigned)(c - 'A' + 10)
                     : (c >= 'a' && c <= 'f') ? (unsigned)(c - 'a' + 10)
                                              : 99;
        if (d > 15)
            return -1;
        v = v * 16 + d;
    }
    return (int)v;
}

/* The bytes token `id` contributes to text, written to o (capacity >= text length). */
static size_t make_piece(const struct ty_tokenizer *t, uint32_t id, char *o)
{
    const char *s = tok_text(t, id);
    size_t n = t->text_len[id], w = 0;
    int ty = t->types[id];
    if (ty == TY_TOK_TYPE_CONTROL || ty == TY_TOK_TYPE_UNKNOWN || ty == TY_TOK_TYPE_UNUSED)
        return 0;
    if (ty == TY_TOK_TYPE_USER_DEFINED) {
        memcpy(o, s, n);
        return n;
    }
    if (t->model == TY_TOK_MODEL_SPM || t->byte_fallback) {
        int b = parse_byte_token(s, n);
        if (b >= 0 && (ty == TY_TOK_TYPE_BYTE || t->byte_fallback || t->model == TY_TOK_MODEL_SPM)) {
            o[0] = (char)b;
            return 1;
        }
        for (size_t i = 0; i < n; i++) {
            if (i + 3 <= n && memcmp(s + i, SPM_SPACE, 3) == 0) {
                o[w++] = ' ';
                i += 2;
            } else {
                o[w++] = s[i];
            }
        }
        return w;
    }
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t cp = utf8_get((const unsigned char *)s + i, n - i, &l);
        int b = ty__tok_cp_to_byte(cp);
        if (b < 0) { /* not a byte-level token: keep its text */
            memcpy(o, s, n);
            return n;
        }
        o[w++] = (char)b;
        i += l;
    }
    return w;
}

static int build_text(struct ty_tokenizer *t, const struct ty_tokenizer_spec *sp, char *eb,
                      size_t el)
{
    size_t total = 0;
    for (uint32_t i = 0; i < sp->n_vocab; i++) {
        if (!sp->tokens[i] && (!sp->token_lens || sp->token_lens[i] != 0)) {
            snprintf(eb, el, "token %u has no text", i);
            return TY_EINVAL;
        }
        size_t l = sp->token_lens ? sp->token_lens[i] : strlen(sp->tokens[i]);
        if (l > 65536) {
            snprintf(eb, el, "token %u is %zu bytes long", i, l);
            return TY_EINVAL;
        }
        total += l + 1;
    }
    if (total > UINT32_MAX / 4) {
        snprintf(eb, el, "vocabulary text too large (%zu bytes)", total);
        return TY_EINVAL;
    }
    t->text = malloc(total);
    t->text_off = malloc(sizeof(uint32_t) * sp->n_vocab);
    t->text_len = malloc(sizeof(uint32_t) * sp->n_vocab);
    if (!t->text || !t->text_off || !t->text_len)
        return TY_ENOMEM;
    size_t off = 0;
    for (uint32_t i = 0; i < sp->n_vocab; i++) {
        size_t l = sp->token_lens ? sp->token_lens[i] : strlen(sp->tokens[i]);
        if (l)
            memcpy(t->text + off, sp->tokens[i], l);
        t->text[off + l] = 0;
        t->text_off[i] = (uint32_t)off;
        t->text_len[i] = (uint32_t)l;
        off += l + 1;
    }
    return 0;
}

static int build_pieces(struct ty_tokenizer *t)
{
    size_t total = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++)
        total += t->text_len[i] + 1;
    t->piece = malloc(total);
    t->piece_off = malloc(sizeof(uint32_t) * t->n_vocab);
    t->piece_len = malloc(sizeof(uint32_t) * t->n_vocab);
    if (!t->piece || !t->piece_off || !t->piece_len)
        return TY_ENOMEM;
    size_t maxl = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++)
        maxl = t->text_len[i] > maxl ? t->text_len[i] : maxl;
    char *tmp = malloc(maxl + 1); /* a piece is never longer than its token text */
    if (!tmp)
        return TY_ENOMEM;
    size_t off = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        size_t l = make_piece(t, i, tmp);
        memcpy(t->piece + off, tmp, l);
        t->piece[off + l] = 0;
        t->piece_off[i] = (uint32_t)off;
        t->piece_len[i] = (uint32_t)l;
        off += l + 1;
    }
    free(tmp);
    return 0;
}

static int cmp_special(const void *a, const void *b)
{
    const struct ty_tok_special *x = a, *y = b;
    unsigned char cx = (unsigned char)x->text[0], cy = (unsigned char)y->text[0];
    if (cx != cy)
        return cx < cy ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

static int build_specials(struct ty_tokenizer *t)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        int ty = t->types[i];
        n += (ty == TY_TOK_TYPE_CONTROL || ty == TY_TOK_TYPE_USER_DEFINED ||
              ty == TY_TOK_TYPE_UNKNOWN) && t->text_len[i] > 0;
    }
    if (n == 0)
        return 0;
    t->specials = calloc(n, sizeof(*t->specials));
    if (!t->specials)
        return TY_ENOMEM;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        int ty = t->types[i];
        if ((ty == TY_TOK_TYPE_CONTROL || ty == TY_TOK_TYPE_USER_DEFINED ||
             ty == TY_TOK_TYPE_UNKNOWN) && t->text_len[i] > 0)
            t->specials[t->n_specials++] = (struct ty_tok_special){
                i, t->text_len[i], tok_text(t, i), ty != TY_TOK_TYPE_USER_DEFINED};
    }
    qsort(t->specials, t->n_specials, sizeof(*t->specials), cmp_special);
    uint32_t j = 0;
    for (unsigned b = 0; b <= 256; b++) {
        while (j < t->n_specials && (unsigned char)t->specials[j].text[0] < b)
            j++;
        t->special_first[b] = j;
    }
    return 0;
}

static int build_regexes(struct ty_tokenizer *t, const struct ty_tokenizer_spec *sp, char *eb,
                         size_t el)
{
    const char *one[1];
    const char *const *list = sp->pre_regexes;
    uint32_t n = sp->n_pre_regexes;
    if (t->model == TY_TOK_MODEL_SPM || sp->no_pre_split || sp->byte_fallback)
        return 0;
    if (n == 0) {
        one[0] = ty__tok_pre_regex(sp->pre);
        if (!one[0]) {
            snprintf(eb, el, "pre-tokenizer \"%s\" is not supported", sp->pre);
            return TY_ENOTSUP;
        }
        list = one;
        n = 1;
    }
    if (n > TY_TOK_MAX_REGEX) {
        snprintf(eb, el, "%u pre-tokenizer regexes (at most %d supported)", n, TY_TOK_MAX_REGEX);
        return TY_ENOTSUP;
    }
    for (uint32_t i = 0; i < n; i++) {
        int ec;
        PCRE2_SIZE eo;
        t->re[i] = pcre2_compile((PCRE2_SPTR)list[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
        if (!t->re[i]) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof(msg));
            snprintf(eb, el, "pre-tokenizer regex does not compile at offset %zu: %s",
                     (size_t)eo, (const char *)msg);
            return TY_EINVAL;
        }
        pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE); /* optional speed-up */
        t->n_re++;
    }
    return 0;
}

static void build_bytes(struct ty_tokenizer *t)
{
    char buf[8];
    for (int b = 0; b < 256; b++) {
        if (t->model == TY_TOK_MODEL_SPM || t->byte_fallback) {
            snprintf(buf, sizeof(buf), "<0x%02X>", b);
            t->byte_ids[b] = ty__tok_lookup(t, buf, 6);
        } else {
            size_t l = utf8_put(buf, ty__tok_byte_to_cp((uint8_t)b));
            t->byte_ids[b] = ty__tok_lookup(t, buf, l);
        }
    }
}

static int check_ids(const struct ty_tokenizer_spec *sp, char *eb, size_t el)
{
    const int32_t ids[4] = {sp->bos_id, sp->eos_id, sp->unk_id, sp->pad_id};
    static const char *names[4] = {"bos", "eos", "unk", "pad"};
    for (int i = 0; i < 4; i++) {
        if (ids[i] < -1 || (ids[i] >= 0 && (uint32_t)ids[i] >= sp->n_vocab)) {
            snprintf(eb, el, "%s id %d is outside the vocabulary (%u tokens)", names[i], ids[i],
                     sp->n_vocab);
            return TY_EINVAL;
        }
    }
    if (sp->model != TY_TOK_MODEL_SPM && sp->model != TY_TOK_MODEL_BPE) {
        snprintf(eb, el, "unknown tokenizer model %d", (int)sp->model);
        return TY_EINVAL;
    }
    if (sp->n_vocab == 0 || !sp->tokens) {
        snprintf(eb, el, "empty vocabulary");
        return TY_EINVAL;
    }
    if (sp->n_merges && !sp->merges) {
        snprintf(eb, el, "n_merges %u without merges", sp->n_merges);
        return TY_EINVAL;
    }
    return 0;
}

static void copy_flags(struct ty_tokenizer *t, const struct ty_tokenizer_spec *sp)
{
    t->model = sp->model;
    t->n_vocab = sp->n_vocab;
    t->bos_id = sp->bos_id;
    t->eos_id = sp->eos_id;
    t->unk_id = sp->unk_id;
    t->pad_id = sp->pad_id;
    t->add_bos = sp->add_bos;
    t->add_eos = sp->add_eos;
    t->add_space_prefix = sp->add_space_prefix;
    t->escape_spaces = sp->model == TY_TOK_MODEL_SPM || sp->byte_fallback;
    t->byte_fallback = sp->byte_fallback;
    t->ignore_merges = sp->ignore_merges;
    if (sp->model == TY_TOK_MODEL_BPE && sp->n_pre_regexes == 0 && sp->pre &&
        (!strcmp(sp->pre, "llama3") || !strcmp(sp->pre, "llama-bpe") ||
         !strcmp(sp->pre, "llama-v3")))
        t->ignore_merges = true; /* as llama.cpp sets for the Llama-3 pre-tokenizer */
    t->bytelevel_prefix_space = sp->bytelevel_add_prefix;
    t->metaspace_split = sp->metaspace_split;
    t->prefix_first_only = sp->prefix_first_only;
    t->norm = sp->normalizer;
}

static int build_arrays(struct ty_tokenizer *t, const struct ty_tokenizer_spec *sp, char *eb,
                        size_t el)
{
    t->types = malloc(sizeof(int32_t) * sp->n_vocab);
    t->scores = calloc(sp->n_vocab, sizeof(float));
    if (!t->types || !t->scores)
        return TY_ENOMEM;
    /* GGUF metadata arrays need not be aligned: copy element by element with memcpy */
    for (uint32_t i = 0; i < sp->n_vocab; i++) {
        int32_t ty = TY_TOK_TYPE_NORMAL;
        if (sp->token_types)
            memcpy(&ty, (const char *)sp->token_types + 4 * (size_t)i, 4);
        if (ty < TY_TOK_TYPE_NORMAL || ty > TY_TOK_TYPE_BYTE)
            ty = TY_TOK_TYPE_NORMAL; /* GGUF files use 0 for "undefined" */
        t->types[i] = ty;
        if (sp->scores)
            memcpy(&t->scores[i], (const char *)sp->scores + 4 * (size_t)i, 4);
    }
    if (sp->chat_template) {
        size_t l = sp->chat_template_len ? sp->chat_template_len : strlen(sp->chat_template);
        t->chat_template = malloc(l + 1);
        if (!t->chat_template)
            return TY_ENOMEM;
        memcpy(t->chat_template, sp->chat_template, l);
        t->chat_template[l] = 0;
    }
    (void)eb;
    (void)el;
    return 0;
}

int ty_tokenizer_new(ty_tokenizer_t **out, const struct ty_tokenizer_spec *sp, char *eb,
                     size_t el)
{
    char dummy[8];
    if (!eb || el == 0) {
        eb = dummy;
        el = sizeof(dummy);
    }
    eb[0] = 0;
    *out = NULL;
    int rc = check_ids(sp, eb, el);
    if (rc)
        return rc;
    struct ty_tokenizer *t = calloc(1, sizeof(*t));
    if (!t)
        return TY_ENOMEM;
    copy_flags(t, sp);
    if ((rc = build_text(t, sp, eb, el)) || (rc = build_arrays(t, sp, eb, el)) ||
        (rc = build_strmap(t)) || (rc = build_merges(t, sp, eb, el)) ||
        (rc = build_pieces(t)) || (rc = build_specials(t)) || (rc = build_regexes(t, sp, eb, el)))
        goto err_free;
    build_bytes(t);
    if (t->model == TY_TOK_MODEL_BPE && !t->byte_fallback && t->byte_ids['a'] < 0) {
        snprintf(eb, el, "byte-level BPE vocabulary lacks the single-byte tokens");
        rc = TY_EINVAL;
        goto err_free;
    }
    *out = t;
    return 0;
err_free:
    if (rc == TY_ENOMEM && !eb[0])
        snprintf(eb, el, "out of memory building the tokenizer");
    ty_tokenizer_free(t);
    return rc;
}

void ty_tokenizer_free(ty_tokenizer_t *t)
{
    if (!t)
        return;
    for (uint32_t i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->piece);
    free(t->piece_off);
    free(t->piece_len);
    free(t->scores);
    free(t->types);
    free(t->map.slots);
    free(t->merges);
    free(t->specials);
    free(t->chat_template);
    free(t->chat_config);
    free(t);
}

const char *ty_tokenizer_piece(const ty_tokenizer_t *t, uint32_t id, size_t *len)
{
    if (id >= t->n_vocab) {
        if (len)
            *len = 0;
        return "";
    }
    if (len)
        *len = t->piece_len[id];
    return t->piece + t->piece_off[id];
}

const char *ty_tokenizer_token_text(const ty_tokenizer_t *t, uint32_t id, size_t *len)
{
    if (id >= t->n_vocab)
        return NULL;
    if (len)
        *len = t->text_len[id];
    return tok_text(t, id);
}

uint32_t ty_tokenizer_n_vocab(const ty_tokenizer_t *t) { return t->n_vocab; }
int32_t ty_tokenizer_bos(const ty_tokenizer_t *t) { return t->bos_id; }
int32_t ty_tokenizer_eos(const ty_tokenizer_t *t) { return t->eos_id; }
const char *ty_tokenizer_chat_template(const ty_tokenizer_t *t) { return t->chat_template; }

bool ty_tokenizer_is_eog(const ty_tokenizer_t *t, uint32_t id)
{
    static const char *const eog[] = {"<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|return|>",
                                      "<|call|>",   "<|eom_id|>", "<end_of_turn>", "</s>"};
    if (id >= t->n_vocab)
        return false;
    if (t->eos_id >= 0 && id == (uint32_t)t->eos_id)
        return true;
    if (t->types[id] != TY_TOK_TYPE_CONTROL)
        return false;
    for (size_t i = 0; i < sizeof(eog) / sizeof(eog[0]); i++) {
        if (strcmp(tok_text(t, id), eog[i]) == 0)
            return true;
    }
    return false;
}

int ty_tokenizer_token_id(const ty_tokenizer_t *t, const char *text)
{
    int32_t id = ty__tok_lookup(t, text, strlen(text));
    return id < 0 ? TY_ENOTFOUND : id;
}
