/* Private state of ty_tokenizer: vocabulary hash, merge table, pre-tokenizer regexes, special
 * tokens. Built once by ty_tokenizer_new() and read-only afterwards, so every function here
 * that takes a `const struct ty_tokenizer *` may run on any thread at once; per-call scratch
 * memory belongs to the call.
 */
#ifndef TYCHO_TOK_IMPL_H
#define TYCHO_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tycho/tokenizer.h"

#define TY_TOK_MAX_REGEX 4

/* Open-addressing map from a byte string to a token id (the vocabulary). */
struct ty_tok_strmap {
    uint32_t *slots; /* [cap] token id + 1, 0 = empty */
    uint32_t cap;    /* power of two */
};

/* Open-addressing map from a pair of token ids to the merge's rank and result. */
struct ty_tok_merge {
    uint64_t key; /* (left << 32 | right) + 1, 0 = empty */
    uint32_t rank;
    uint32_t result;
};

struct ty_tok_special {
    uint32_t id;
    uint32_t len;
    const char *text; /* points into tok->text */
    bool control;     /* matched only with parse_special */
};

struct ty_tokenizer {
    enum ty_tok_model model;
    uint32_t n_vocab;
    char *text;              /* all token texts, NUL-separated */
    uint32_t *text_off;      /* [n_vocab] offset into text */
    uint32_t *text_len;      /* [n_vocab] */
    char *piece;             /* decoded bytes of every token, NUL-separated */
    uint32_t *piece_off;     /* [n_vocab] */
    uint32_t *piece_len;     /* [n_vocab] */
    float *scores;           /* [n_vocab] (SPM) */
    int32_t *types;          /* [n_vocab] enum ty_tok_type */
    struct ty_tok_strmap map;
    struct ty_tok_merge *merges; /* [merge_cap] */
    uint32_t merge_cap;          /* power of two, 0 = none */
    int32_t byte_ids[256];       /* SPM/byte-fallback: id of <0xNN>; BPE: id of the mapped char */
    struct ty_tok_special *specials; /* sorted by first byte, then longest first */
    uint32_t n_specials;
    uint32_t special_first[257]; /* specials starting with byte b: [first[b], first[b+1]) */
    pcre2_code *re[TY_TOK_MAX_REGEX];
    uint32_t n_re;
    enum ty_tok_norm norm;
    int32_t bos_id, eos_id, unk_id, pad_id;
    bool add_bos, add_eos, add_space_prefix, escape_spaces;
    bool byte_fallback, ignore_merges, bytelevel_prefix_space, metaspace_split;
    bool prefix_first_only; /* Metaspace prepend_scheme "first" */
    char *chat_template; /* or NULL */
    char *chat_config;   /* JSON text from tokenizer_config.json (hf_json.c), or NULL */
};

/* ---- internal, shared between the tokenizer's files ---- */

/* Id of the exact byte string s[0..n), or -1. */
int32_t ty__tok_lookup(const struct ty_tokenizer *t, const char *s, size_t n);

/* Growable id list used by the encoders. */
struct ty_tok_ids {
    uint32_t *v;
    size_t n, cap;
};
int ty__tok_ids_push(struct ty_tok_ids *ids, uint32_t id);

/* Encode one pre-token (already normalized) with the tokenizer's model, appending ids. */
int ty__tok_spm_encode(const struct ty_tokenizer *t, const char *s, size_t n,
                       struct ty_tok_ids *out);
int ty__tok_bpe_encode(const struct ty_tokenizer *t, const char *s, size_t n,
                       struct ty_tok_ids *out);

/* GPT-2 byte-to-unicode map: the code point standing for byte b, and the inverse (-1 when the
 * code point stands for no byte). */
uint32_t ty__tok_byte_to_cp(uint8_t b);
int ty__tok_cp_to_byte(uint32_t cp);

/* Length of the UTF-8 sequence starting at s[0] (1 for an invalid lead byte), capped at n. */
size_t ty__tok_utf8_len(const unsigned char *s, size_t n);

/* Built-in pre-tokenizer regex for a GGUF tokenizer.ggml.pre name, or NULL when unknown. */
const char *ty__tok_pre_regex(const char *pre);

#endif
