/* Tokenizers: SentencePiece-style BPE with byte fallback, and byte-level BPE (GPT-2, Llama-3,
 * Qwen). A tokenizer is immutable once built and may be used from any number of threads at once;
 * the incremental detokenizer (struct ty_detok) is per sequence and owned by one thread.
 *
 * A tokenizer is built from a ty_tokenizer_spec (what a GGUF file's tokenizer.ggml.* metadata
 * or a tokenizer.json holds), so the model loaders and this library stay independent: the GGUF
 * reader fills a spec and calls ty_tokenizer_new(); ty_tokenizer_load_json() reads a Hugging
 * Face tokenizer.json (plus tokenizer_config.json beside it, when present).
 */
#ifndef TYCHO_TOKENIZER_H
#define TYCHO_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ty_tokenizer ty_tokenizer_t;

enum ty_tok_model {
    TY_TOK_MODEL_SPM = 0, /* SentencePiece BPE by scores, "▁" for spaces, <0xNN> byte fallback */
    TY_TOK_MODEL_BPE = 1, /* byte-level BPE by merge ranks (GPT-2 byte-to-unicode mapping) */
};

/* Token attributes, as in GGUF tokenizer.ggml.token_type. */
enum ty_tok_type {
    TY_TOK_TYPE_NORMAL = 1,
    TY_TOK_TYPE_UNKNOWN = 2,
    TY_TOK_TYPE_CONTROL = 3,
    TY_TOK_TYPE_USER_DEFINED = 4,
    TY_TOK_TYPE_UNUSED = 5,
    TY_TOK_TYPE_BYTE = 6,
};

/* Unicode normalization applied to input text before pre-tokenization (tokenizer.json
 * "normalizer"), through utf8proc. */
enum ty_tok_norm {
    TY_TOK_NORM_NONE = 0,
    TY_TOK_NORM_NFC,
    TY_TOK_NORM_NFKC,
    TY_TOK_NORM_NFD,
    TY_TOK_NORM_NFKD,
};

/* Everything needed to build a tokenizer. Arrays are borrowed for the duration of
 * ty_tokenizer_new() only (the tokenizer copies what it keeps); `scores` and `token_types` may
 * be unaligned (they often point straight into a GGUF file's metadata). Strings need not be
 * NUL-terminated when a length array is given. */
struct ty_tokenizer_spec {
    enum ty_tok_model model;
    uint32_t n_vocab;
    const char *const *tokens;  /* [n_vocab] token text (SPM: with "▁"; BPE: byte-level form) */
    const uint32_t *token_lens; /* [n_vocab] or NULL (then tokens are NUL-terminated) */
    const float *scores;        /* [n_vocab] SPM merge scores, or NULL */
    const int32_t *token_types; /* [n_vocab] enum ty_tok_type, or NULL (all NORMAL) */
    uint32_t n_merges;
    const char *const *merges; /* [n_merges] "left right", rank = index (BPE) */
    const char *pre;           /* pre-tokenizer name as GGUF tokenizer.ggml.pre: "default",
                                  "llama3"/"llama-bpe", "qwen2", "gpt2", "gpt-4o", ...; NULL = default */
    int32_t bos_id, eos_id, unk_id, pad_id; /* -1 when absent */
    bool add_bos, add_eos;
    bool add_space_prefix; /* SPM: prepend "▁" to the text (llama default true) */

    /* Fields below were added for tokenizer.json; zero keeps the GGUF behaviour. */
    const char *const *pre_regexes; /* Split regexes applied in order; when set, override `pre` */
    uint32_t n_pre_regexes;         /* at most 4 */
    enum ty_tok_norm normalizer;
    /* BPE over UTF-8 characters with <0xNN> fallback (SentencePiece converted to HF BPE, e.g.
     * Llama-2 / stories260K-hf tokenizer.json) instead of GPT-2 byte-level symbols; spaces become
     * "▁" and add_space_prefix prepends one to every text segment. */
    bool byte_fallback;
    bool ignore_merges;        /* BPE: a pre-token that is itself a token is taken whole */
    bool no_pre_split;         /* BPE: no regex split at all (tokenizer.json without Split) */
    bool bytelevel_add_prefix; /* ByteLevel add_prefix_space: " " before text not starting so */
    bool metaspace_split;      /* Metaspace split=true: a pre-token starts at every "▁" */
    bool prefix_first_only;    /* add_space_prefix only at the start of the text, not after
                                  every special token (Metaspace prepend_scheme "first") */
    const char *chat_template; /* Jinja text (GGUF tokenizer.chat_template), copied; or NULL */
    uint32_t chat_template_len; /* 0 = NUL-terminated */
};

/* Build a tokenizer from a spec. Returns 0, TY_EINVAL (inconsistent spec, with a message
 * in errbuf) or TY_ENOMEM. */
int ty_tokenizer_new(ty_tokenizer_t **out, const struct ty_tokenizer_spec *spec, char *errbuf,
                     size_t errlen);

/* Load a Hugging Face tokenizer: `path` is a tokenizer.json file or a directory holding one
 * (tokenizer_config.json beside it supplies bos/eos and add_bos). Errors: TY_ENOENT, TY_EPARSE,
 * TY_ENOTSUP (a model or pre-tokenizer kind not implemented), with a message in errbuf. */
int ty_tokenizer_load_json(ty_tokenizer_t **out, const char *path, char *errbuf, size_t errlen);

/* The same from tokenizer.json text in memory (no tokenizer_config.json). */
int ty_tokenizer_load_json_buf(ty_tokenizer_t **out, const char *json, size_t len, char *errbuf,
                               size_t errlen);

void ty_tokenizer_free(ty_tokenizer_t *tok);

/* Encode UTF-8 text. Writes up to `max_ids` ids and returns the total count the text needs
 * (call again with a larger buffer when it exceeds max_ids), or a negative TY_E* code.
 * `add_special` adds BOS/EOS as the tokenizer is configured to; `parse_special` recognises
 * special/added token text (e.g. "<|im_start|>") in the input. */
int ty_tokenizer_encode(const ty_tokenizer_t *tok, const char *text, size_t len, bool add_special,
                        bool parse_special, uint32_t *ids, size_t max_ids);

/* Raw bytes of one token as it contributes to output text (byte-fallback and byte-level tokens
 * decoded; control tokens give ""). Never NULL for id < n_vocab. */
const char *ty_tokenizer_piece(const ty_tokenizer_t *tok, uint32_t id, size_t *len);

/* Decode ids to UTF-8 into buf (NUL-terminated, truncated to cap); returns the full length or a
 * negative error. `skip_special` drops control tokens. Leading-space rules follow the model. */
int ty_tokenizer_decode(const ty_tokenizer_t *tok, const uint32_t *ids, size_t n, bool skip_special,
                        char *buf, size_t cap);

/* Fill a spec from a GGUF file's tokenizer.ggml.* metadata (tokenizer model "llama" or
 * "gpt2"), then build. Defined in ty_tokenizer but calls the gguf.h accessors, so a binary using
 * it links ty_engine too. Errors: TY_ENOTSUP (other tokenizer models), TY_EFORMAT (missing or
 * inconsistent arrays), with a message. */
struct ty_gguf;
int ty_tokenizer_new_from_gguf(ty_tokenizer_t **out, const struct ty_gguf *g, char *errbuf,
                               size_t errlen);

/* The Jinja chat template the tokenizer came with (chat_template.jinja, which wins as in
 * transformers, else tokenizer_config.json's — of a named list the "default" one —, or GGUF
 * tokenizer.chat_template), or NULL. Lives as long as the tokenizer. */
const char *ty_tokenizer_chat_template(const ty_tokenizer_t *tok);
/* The chat settings of a Hugging Face tokenizer_config.json as JSON text, or NULL (GGUF, or no
 * config): {"special_tokens": {"bos_token": "<s>", ..., "additional_special_tokens": [...]},
 * "templates": {"default": "...", "tool_use": "..."}}, the special tokens as transformers'
 * special_tokens_map gives them, "templates" only for the list form of "chat_template" (and
 * not when chat_template.jinja replaces it). Lives as long as the tokenizer. */
const char *ty_tokenizer_chat_config(const ty_tokenizer_t *tok);
/* Text of a token as stored in the vocabulary (control tokens too); NULL when id is out of
 * range. */
const char *ty_tokenizer_token_text(const ty_tokenizer_t *tok, uint32_t id, size_t *len);

uint32_t ty_tokenizer_n_vocab(const ty_tokenizer_t *tok);
int32_t ty_tokenizer_bos(const ty_tokenizer_t *tok);
int32_t ty_tokenizer_eos(const ty_tokenizer_t *tok);
/* True for end-of-generation tokens (eos, <|eot_id|>, <|im_end|>, ...). */
bool ty_tokenizer_is_eog(const ty_tokenizer_t *tok, uint32_t id);
/* Id of a token's exact text, or TY_ENOTFOUND. */
int ty_tokenizer_token_id(const ty_tokenizer_t *tok, const char *text);

/* Incremental detokenizer: feed ids one at a time, get only complete UTF-8 back; a multi-byte
 * character split over tokens is held until it completes, so a stream never carries a broken
 * sequence. Zero-initialise, then call ty_detok_init(). */
struct ty_detok {
    const ty_tokenizer_t *tok;
    uint32_t n_fed;       /* ids fed so far (to drop the SPM leading space of the first piece) */
    unsigned char pending[8];
    uint32_t n_pending;
    uint64_t n_out; /* bytes returned so far */
    bool started;   /* a non-empty piece was fed; set true after init to keep a leading space */
};
void ty_detok_init(struct ty_detok *d, const ty_tokenizer_t *tok);
/* Append the text of `id` to out (capacity cap, NUL-terminated); returns bytes written (>= 0)
 * or TY_ERANGE when cap is too small (cap of 64 always suffices for one token of <=56 bytes). */
int ty_detok_feed(struct ty_detok *d, uint32_t id, char *out, size_t cap);
/* Flush what is held at the end of the stream (incomplete bytes become U+FFFD). */
int ty_detok_flush(struct ty_detok *d, char *out, size_t cap);

/* ---- chat templates --------------------------------------------------------------------- */

enum ty_chat_family {
    TY_CHAT_NONE = 0,
    TY_CHAT_LLAMA2,
    TY_CHAT_LLAMA3,
    TY_CHAT_CHATML, /* Qwen, SmolLM, many others */
    TY_CHAT_MISTRAL,
    TY_CHAT_GPTOSS, /* harmony format */
    TY_CHAT_QWEN3,  /* chatml with <think> blocks (Qwen3's template) */
};

/* Variables some templates read besides the messages. Zero = the template's defaults. */
struct ty_chat_opts {
    const char *date;             /* gpt-oss "Current date:" as YYYY-MM-DD; NULL = today (UTC) */
    const char *reasoning_effort; /* gpt-oss; NULL = "medium" */
    bool disable_thinking;        /* qwen3 enable_thinking=false: empty think block appended */
};

struct ty_chat_msg {
    const char *role; /* "system", "user", "assistant", "tool" */
    const char *content;
};

/* Recognize a model's Jinja chat template by its text. Returns TY_CHAT_NONE when unknown. */
enum ty_chat_family ty_chat_detect(const char *template_text);
/* Parse a configured family name ("llama-2", "llama-3", "chatml", "mistral", "gpt-oss",
 * "qwen3"). Returns 0 or TY_EINVAL. */
int ty_chat_family_parse(const char *name, enum ty_chat_family *out);
const char *ty_chat_family_name(enum ty_chat_family f);

/* Render messages with the family's format, adding the assistant generation prompt when
 * `add_generation_prompt`. Returns a malloc'ed string (caller frees) or NULL on TY_ENOMEM/EINVAL;
 * `bos_text`/`eos_text` are the tokenizer's special token texts (may be NULL). */
char *ty_chat_render(enum ty_chat_family f, const struct ty_chat_msg *msgs, size_t n,
                     bool add_generation_prompt, const char *bos_text, const char *eos_text);
/* Same, with template variables (opts may be NULL). A conversation the template rejects
 * (roles not alternating for llama-2/mistral, a system message for mistral) gives NULL. */
char *ty_chat_render_opts(enum ty_chat_family f, const struct ty_chat_msg *msgs, size_t n,
                          bool add_generation_prompt, const char *bos_text, const char *eos_text,
                          const struct ty_chat_opts *opts);

#endif
