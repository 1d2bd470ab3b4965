/* Detokenizing and stop strings of the tokens the Conductor relays (cluster-impl.h). The rules
 * are ty_engine_generate's (src/engine/generate.c) and the decode worker's, so the cluster's
 * text equals `tycho generate`'s and `tycho serve`'s for the same ids. */
#include "cluster-impl.h"

#include "tycho/errors.h"

#include <stdlib.h>
#include <string.h>

int ty__ctext_init(struct ty__ctext *t, const ty_tokenizer_t *tok, const char *const *stop,
                   size_t n_stop)
{
    memset(t, 0, sizeof(*t));
    t->tok = tok;
    if (tok)
        ty_detok_init(&t->detok, tok);
    for (size_t i = 0; i < n_stop && i < TY_SERVE_MAX_STOP; i++) {
        if (!stop[i] || !*stop[i])
            continue;
        size_t k = 0;
        while (t->stop[k])
            k++;
        if (!(t->stop[k] = strdup(stop[i]))) {
            ty__ctext_clear(t);
            return TY_ENOMEM;
        }
        if (strlen(stop[i]) > t->max_stop)
            t->max_stop = strlen(stop[i]);
    }
    return 0;
}

void ty__ctext_clear(struct ty__ctext *t)
{
    for (size_t i = 0; i < TY_SERVE_MAX_STOP; i++)
        free(t->stop[i]);
    free(t->text);
    memset(t, 0, sizeof(*t));
}

static int push_bytes(struct ty__ctext *t, const char *s, size_t n)
{
    if (t->n_text + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        while (cap < t->n_text + n + 1)
            cap *= 2;
        char *nt = realloc(t->text, cap);
        if (!nt)
            return TY_ENOMEM;
        t->text = nt;
        t->cap = cap;
    }
    memcpy(t->text + t->n_text, s, n);
    t->n_text += n;
    t->text[t->n_text] = 0;
    return 0;
}

int ty__ctext_push(struct ty__ctext *t, uint32_t id)
{
    if (!t->tok)
        return 0;
    char piece[64];
    int n = ty_detok_feed(&t->detok, id, piece, sizeof(piece));
    size_t before = t->n_text;
    if (n > 0 && push_bytes(t, piece, (size_t)n))
        return TY_ENOMEM;
    for (size_t i = 0; i < TY_SERVE_MAX_STOP && t->stop[i]; i++) {
        size_t sl = strlen(t->stop[i]);
        size_t from = before > sl ? before - sl + 1 : 0;
        char *hit = t->text ? strstr(t->text + from, t->stop[i]) : NULL;
        if (hit) {
            t->n_text = (size_t)(hit - t->text);
            t->text[t->n_text] = 0;
            return 1;
        }
    }
    return 0;
}

void ty__ctext_flush(struct ty__ctext *t)
{
    if (!t->tok)
        return;
    char tail[64];
    int k = ty_detok_flush(&t->detok, tail, sizeof(tail));
    if (k > 0)
        push_bytes(t, tail, (size_t)k);
}

size_t ty__ctext_safe_end(const struct ty__ctext *t, bool final)
{
    if (final || !t->max_stop)
        return t->n_text;
    size_t end = t->n_text > t->max_stop - 1 ? t->n_text - (t->max_stop - 1) : 0;
    while (end > t->n_emitted && ((unsigned char)t->text[end] & 0xc0) == 0x80)
        end--;
    return end < t->n_emitted ? t->n_emitted : end;
}
