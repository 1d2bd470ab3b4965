/* Streamed output text with stop strings (tycho/stoptext.h). The hold-back rule is what makes
 * "never retract" hold: a stop string of length L that completes in a later push starts at
 * most L-1 bytes before the current end, and safe_end keeps the last max_stop-1 bytes back. */
#include "tycho/stoptext.h"

#include "tycho/errors.h"

#include <stdlib.h>
#include <string.h>

int ty_stoptext_init(struct ty_stoptext *st, const ty_tokenizer_t *tok, const char *const *stop,
                     size_t n_stop)
{
    memset(st, 0, sizeof(*st));
    if (tok) {
        ty_detok_init(&st->detok, tok);
        /* generated text continues a prompt: the first piece keeps its leading space ("The
         * little dog" + " was"), as vLLM and llama.cpp's server return it */
        st->detok.started = true;
    }
    size_t n = 0;
    for (size_t i = 0; i < n_stop; i++)
        n += stop[i] && *stop[i];
    if (!n)
        return 0;
    if (!(st->stop = calloc(n, sizeof(char *))))
        return TY_ENOMEM;
    for (size_t i = 0; i < n_stop; i++) {
        if (!stop[i] || !*stop[i])
            continue;
        size_t l = strlen(stop[i]);
        if (!(st->stop[st->n_stop] = strdup(stop[i]))) {
            ty_stoptext_clear(st);
            return TY_ENOMEM;
        }
        st->n_stop++;
        if (l > st->max_stop)
            st->max_stop = l;
    }
    return 0;
}

void ty_stoptext_clear(struct ty_stoptext *st)
{
    for (size_t i = 0; i < st->n_stop; i++)
        free(st->stop[i]);
    free(st->stop);
    free(st->text);
    memset(st, 0, sizeof(*st));
}

/* Room for `more` bytes after the text plus its NUL. */
static int reserve(struct ty_stoptext *st, size_t more)
{
    if (st->n_text + more + 1 <= st->cap)
        return 0;
    size_t cap = st->cap ? st->cap * 2 : 256;
    while (cap < st->n_text + more + 1)
        cap *= 2;
    char *nt = realloc(st->text, cap);
    if (!nt)
        return TY_ENOMEM;
    st->text = nt;
    st->cap = cap;
    return 0;
}

/* First occurrence of s[0..sl) in h[0..n) (text may hold NUL bytes, so no strstr). */
static const char *find(const char *h, size_t n, const char *s, size_t sl)
{
    for (size_t i = 0; i + sl <= n; i++)
        if (h[i] == s[0] && memcmp(h + i + 1, s + 1, sl - 1) == 0)
            return h + i;
    return NULL;
}

/* Cut the text at the earliest stop string that completed since `before` bytes. An occurrence
 * ending at or before `before` was looked for by an earlier call, so each stop string is only
 * searched where it could end in the new bytes. */
static void check_stop(struct ty_stoptext *st, size_t before)
{
    const char *first = NULL;
    for (size_t i = 0; i < st->n_stop; i++) {
        size_t sl = strlen(st->stop[i]);
        size_t from = before >= sl ? before - sl + 1 : 0;
        const char *hit = find(st->text + from, st->n_text - from, st->stop[i], sl);
        if (hit && (!first || hit < first))
            first = hit;
    }
    if (first) {
        st->n_text = (size_t)(first - st->text);
        st->text[st->n_text] = 0;
        st->hit = true;
    }
}

int ty_stoptext_push(struct ty_stoptext *st, uint32_t id)
{
    const ty_tokenizer_t *tok = st->detok.tok;
    if (!tok || st->hit || id >= ty_tokenizer_n_vocab(tok))
        return 0;
    size_t l;
    ty_tokenizer_piece(tok, id, &l);
    /* held bytes (at most 3) + the piece, each byte at worst a 3-byte U+FFFD, + NUL */
    size_t need = 3 * (l + 3) + 1;
    int rc = reserve(st, need);
    if (rc)
        return rc;
    int n = ty_detok_feed(&st->detok, id, st->text + st->n_text, need);
    if (n < 0)
        return n; /* TY_ENOMEM: the id is valid and the buffer big enough */
    size_t before = st->n_text;
    st->n_text += (size_t)n;
    if (n > 0)
        check_stop(st, before);
    return n;
}

int ty_stoptext_flush(struct ty_stoptext *st)
{
    if (!st->detok.tok || st->hit)
        return 0;
    int rc = reserve(st, 16);
    if (rc)
        return rc;
    int n = ty_detok_flush(&st->detok, st->text + st->n_text, 16);
    if (n < 0)
        return n;
    st->n_text += (size_t)n;
    return 0;
}

bool ty_stoptext_hit(const struct ty_stoptext *st)
{
    return st->hit;
}

size_t ty_stoptext_safe_end(const struct ty_stoptext *st, bool final)
{
    if (final || st->hit || !st->max_stop)
        return st->n_text;
    size_t end = st->n_text > st->max_stop - 1 ? st->n_text - (st->max_stop - 1) : 0;
    while (end > st->n_sent && ((unsigned char)st->text[end] & 0xc0) == 0x80)
        end--;
    return end < st->n_sent ? st->n_sent : end;
}

const char *ty_stoptext_take(struct ty_stoptext *st, size_t end, size_t *len)
{
    if (end > st->n_text)
        end = st->n_text;
    if (end <= st->n_sent) {
        *len = 0;
        return "";
    }
    const char *p = st->text + st->n_sent;
    *len = end - st->n_sent;
    st->n_sent = end;
    return p;
}

char *ty_stoptext_release(struct ty_stoptext *st, size_t *len)
{
    char *t = st->text;
    *len = t ? st->n_text : 0;
    if (!t)
        return calloc(1, 1);
    st->text = NULL;
    st->n_text = st->cap = st->n_sent = 0;
    return t;
}
