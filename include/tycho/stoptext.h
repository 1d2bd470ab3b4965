/* Streamed output text of one sequence: the incremental detokenizer plus OpenAI stop strings.
 * Ids go in one at a time; the text grows by whole UTF-8 characters only; the first stop string
 * that appears cuts the text before it (the stop string itself is never returned); and
 * ty_stoptext_safe_end() says how much may be sent now, holding back the bytes that could still
 * be the start of a stop string, so text once sent is never retracted and a chunk never ends
 * inside a UTF-8 character. `tycho generate`, `tycho serve`'s worker and the Conductor all use
 * it, so the three give the same text for the same ids.
 *
 * One object per sequence, used by one thread at a time. It copies the stop strings and owns its
 * text buffer; the tokenizer is borrowed and must outlive it. Zero-initialise or _init, always
 * _clear. */
#ifndef TYCHO_STOPTEXT_H
#define TYCHO_STOPTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tycho/tokenizer.h"

struct ty_stoptext {
    struct ty_detok detok;   /* detok.tok NULL: no tokenizer, push and flush do nothing */
    char **stop;             /* [n_stop] non-empty stop strings, copied */
    size_t n_stop, max_stop; /* max_stop: the longest one's length in bytes */
    char *text;              /* NUL-terminated when non-NULL; may hold NUL bytes itself */
    size_t n_text, cap;
    size_t n_sent; /* bytes handed out by ty_stoptext_take() */
    bool hit;      /* a stop string matched: text was cut at n_text and is final */
};

/* Set up `st` for a new sequence with stop strings stop[0..n_stop) (copied; NULL and "" entries,
 * which would match everywhere, are ignored). `tok` may be NULL (ids only, no text).
 * Returns 0 or TY_ENOMEM (then `st` is cleared). */
int ty_stoptext_init(struct ty_stoptext *st, const ty_tokenizer_t *tok, const char *const *stop,
                     size_t n_stop);
/* Free the copies and the text; `st` is zeroed (init or clear again is fine). */
void ty_stoptext_clear(struct ty_stoptext *st);

/* Add the text of token `id`. Returns the number of bytes the detokenizer appended (0 while a
 * UTF-8 character is incomplete, and for an id outside the tokenizer's vocabulary, as a model's
 * padded vocabulary may sample) or TY_ENOMEM; a piece of any length fits. When a stop string
 * now appears, the text is cut before its first occurrence (the earliest in the text, whichever
 * stop string it is) and ty_stoptext_hit() becomes true; after that, pushes change nothing and
 * return 0. */
int ty_stoptext_push(struct ty_stoptext *st, uint32_t id);
/* End of stream: append what the detokenizer still holds (an incomplete character becomes
 * U+FFFD). Does nothing after a stop string matched. Returns 0 or TY_ENOMEM. */
int ty_stoptext_flush(struct ty_stoptext *st);

/* True when a stop string matched; the text ends where it began (st->n_text). */
bool ty_stoptext_hit(const struct ty_stoptext *st);
/* End of the text that may be sent now: all of it when `final` (the sequence ended) or a stop
 * string matched; otherwise all but the last max_stop-1 bytes, moved back to a character
 * boundary. Never below what was already taken. */
size_t ty_stoptext_safe_end(const struct ty_stoptext *st, bool final);
/* Hand out the bytes not sent yet up to `end` (a safe_end value; 0 = nothing): returns a
 * pointer into the text (valid until the next push or flush; "" when there is nothing) and
 * their count in *len; they count as sent from now on. */
const char *ty_stoptext_take(struct ty_stoptext *st, size_t end, size_t *len);
/* The whole text as a malloc'ed NUL-terminated string the caller owns ("" when empty), or NULL
 * on TY_ENOMEM, its length in *len (a decoded NUL byte may sit inside it); `st` is left with
 * no text (clear it still). */
char *ty_stoptext_release(struct ty_stoptext *st, size_t *len);

#endif
