/* Structured output: a JSON schema (or "any JSON object") compiled into a grammar, a byte trie
 * over a tokenizer's vocabulary, and a per-sequence matcher that says which tokens may come
 * next (a bit mask over the vocabulary) and advances over the tokens sampled.
 *
 * The matcher is a pushdown automaton over bytes with a set of parallel stacks (anyOf, optional
 * properties and numbers that may end or go on are non-deterministic until later bytes decide).
 * A mask walks the vocabulary trie with the stacks and prunes a subtree at its first rejected
 * byte; inside a plain string (the common state) the tokens that stay in the string are a set
 * precomputed per vocabulary, and only tokens holding '"' or '\\' are checked one by one
 * (XGrammar's context-independent tokens); other masks are cached per state.
 *
 * Output always parses even when the token budget would cut it: the mask admits a token only
 * when the shortest completion (in bytes) from the state after it fits in the tokens left
 * after it (`budget` - 1, one byte per token at worst: every vocabulary we serve has a token
 * for each single byte), so close to the end only tokens that close strings, arrays and
 * objects or write the shortest required members remain. A budget below the shortest document
 * cannot be met: then the mask admits the tokens that shorten the way to the end.
 *
 * Whitespace is bounded: at most TY_GRAMMAR_MAX_WS bytes of ' ', '\n' or '\t' where JSON
 * allows it between tokens (none inside literals and numbers, none before the document and
 * none after it), so a small model cannot spin on spaces. Properties come in schema order
 * (as OpenAI's strict mode emits them); optional ones may be left out; extra properties (where
 * additionalProperties allows them) may come anywhere, with a name other than a declared one.
 *
 * Threads: a compiled grammar and a vocabulary index are immutable once made and may be shared
 * between threads (the caller keeps them alive longer than every matcher using them); a
 * matcher belongs to one thread. Ownership: _new/_free pairs; matchers borrow their grammar and
 * vocabulary.
 */
#ifndef TYCHO_GRAMMAR_H
#define TYCHO_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TY_GRAMMAR_MAX_WS 4      /* whitespace bytes at one place between JSON tokens */
#define TY_GRAMMAR_MAX_DEPTH 48  /* nesting of arrays/objects (deeper is not admitted) */

enum ty_grammar_kind { TY_GRAMMAR_JSON_OBJECT = 1, TY_GRAMMAR_JSON_SCHEMA = 2 };

struct ty_gen_grammar {
    enum ty_grammar_kind kind;
    const char *schema; /* JSON_SCHEMA: the schema's JSON text */
    size_t schema_len;
};

typedef struct ty_grammar ty_grammar_t; /* compiled, immutable, shareable between threads */

/* Compile. Returns 0, TY_ENOTSUP (a keyword outside the supported subset: err names it, e.g.
 * "unsupported JSON schema keyword 'pattern' at /properties/name"), TY_EINVAL (not a valid
 * schema: err says why), TY_ENOMEM. Pure, any thread. The API calls it to validate before
 * accepting a request. Supported: type (one or a list), properties, required,
 * additionalProperties, items, prefixItems, minItems, maxItems, enum, const, anyOf, oneOf (as
 * anyOf), allOf with one member, $ref to #/$defs/... or #/definitions/... (recursion allowed),
 * minLength, maxLength, nullable; annotations (title, description, default, examples, $schema,
 * $id, $comment, format, strict) are ignored. */
int ty_grammar_compile(ty_grammar_t **out, const struct ty_gen_grammar *spec, char *err,
                       size_t errlen);
void ty_grammar_free(ty_grammar_t *g);

/* ---- the vocabulary index --------------------------------------------------------------- */

typedef struct ty_grammar_vocab ty_grammar_vocab_t;
struct ty_tokenizer;

/* Build the index of a tokenizer's vocabulary: each token's bytes (ty_tokenizer_piece);
 * control tokens (empty pieces) are never admitted; the end-of-generation tokens are admitted
 * exactly when the document is complete. Returns 0, TY_EINVAL or TY_ENOMEM. Any thread; takes
 * about 0.1 s for a 128k vocabulary. The tokenizer may be freed afterwards. */
int ty_grammar_vocab_new(ty_grammar_vocab_t **out, const struct ty_tokenizer *tok);
/* The same from raw token bytes (tests, fuzzing): `n` tokens, token i is pieces[i] (lens[i]
 * bytes, 0: never admitted); `eog` (n_eog ids) end generation. Copies what it keeps. */
int ty_grammar_vocab_new_pieces(ty_grammar_vocab_t **out, const char *const *pieces,
                                const size_t *lens, uint32_t n, const uint32_t *eog,
                                size_t n_eog);
void ty_grammar_vocab_free(ty_grammar_vocab_t *v);
uint32_t ty_grammar_vocab_size(const ty_grammar_vocab_t *v);
/* Words of a mask over v: (size + 31) / 32; token i is allowed when bit i % 32 of word i / 32
 * is set. */
size_t ty_grammar_mask_words(const ty_grammar_vocab_t *v);

/* ---- the matcher ------------------------------------------------------------------------ */

typedef struct ty_grammar_matcher ty_grammar_matcher_t;

/* A matcher at the start of a document. Borrows g and v. Returns 0 or TY_ENOMEM. */
int ty_grammar_matcher_new(ty_grammar_matcher_t **out, const ty_grammar_t *g,
                           const ty_grammar_vocab_t *v);
void ty_grammar_matcher_free(ty_grammar_matcher_t *m);
/* Fill `mask` (ty_grammar_mask_words(v) words) with the tokens that may come next when at
 * most `budget` more tokens may be generated (this one included; UINT32_MAX: no limit).
 * Returns the number of tokens allowed or TY_ENOMEM. 0 happens only where no token can follow
 * (a complete document that cannot go on, with a vocabulary that has no end-of-generation
 * token) or, with a budget below the shortest completion, no token shortens it. */
int ty_grammar_matcher_fill_mask(ty_grammar_matcher_t *m, uint32_t budget, uint32_t *mask);
/* Advance over token `id` (an end-of-generation token is accepted when complete and changes
 * nothing). Returns 0 or TY_EINVAL (the grammar does not admit it: the matcher is unchanged). */
int ty_grammar_matcher_accept(ty_grammar_matcher_t *m, uint32_t id);
/* Advance over raw bytes (tests). Returns 0 or TY_EINVAL (unchanged). */
int ty_grammar_matcher_accept_bytes(ty_grammar_matcher_t *m, const char *s, size_t n);
/* True when what was accepted is a whole document. */
bool ty_grammar_matcher_is_complete(const ty_grammar_matcher_t *m);
/* Shortest number of bytes that completes the document from here (0: complete). */
uint32_t ty_grammar_matcher_min_close(const ty_grammar_matcher_t *m);

/* Set logits[i] = -inf for every i < n not allowed by `mask` (of `n_mask_bits` tokens; ids at
 * or above it are disallowed). */
void ty_grammar_mask_apply(const uint32_t *mask, uint32_t n_mask_bits, float *logits, uint32_t n);

#endif
