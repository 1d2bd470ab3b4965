/* Decoding ids to text, whole or incrementally. Both paths run every byte through the same
 * UTF-8 checker (Unicode "maximal subpart" replacement by U+FFFD), so a stream fed token by
 * token yields exactly the bytes of the full decode and never a broken sequence. */
#include "tok-impl.h"

#include <stdlib.h>
#include <string.h>

#include "tycho/errors.h"

#define REPL "\xef\xbf\xbd"

/* Bounded output: writes what fits, counts everything. */
struct sink {
    char *buf;
    size_t cap, len;
};

static void sink_put(struct sink *k, const void *p, size_t n)
{
    if (k->len < k->cap) {
        size_t room = k->cap - k->len;
        memcpy(k->buf + k->len, p, n < room ? n : room);
    }
    k->len += n;
}

/* Allowed range of the continuation byte at position i (1-based) after lead byte b. */
static bool cont_ok(unsigned char b, size_t i, unsigned char c)
{
    unsigned lo = 0x80, hi = 0xBF;
    if (i == 1) {
        if (b == 0xE0)
            lo = 0xA0;
        else if (b == 0xED)
            hi = 0x9F;
        else if (b == 0xF0)
            lo = 0x90;
        else if (b == 0xF4)
            hi = 0x8F;
    }
    return c >= lo && c <= hi;
}

static size_t seq_len(unsigned char b)
{
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF)
        return 3;
    if (b >= 0xF0 && b <= 0xF4)
        return 4;
    return 0;
}

/* Copy s[0..n) to k with invalid sequences replaced. Returns the count of bytes consumed: all
 * of them when `final`, else the trailing incomplete-but-valid prefix is left unconsumed. */
static size_t utf8_clean(struct sink *k, const unsigned char *s, size_t n, bool final)
{
    size_t i = 0;
    while (i < n) {
        size_t l = seq_len(s[i]);
        if (l == 0) {
            sink_put(k, REPL, 3);
            i++;
            continue;
        }
        size_t j = 1;
        while (j < l && i + j < n && cont_ok(s[i], j, s[i + j]))
            j++;
        if (j == l) {
            sink_put(k, s + i, l);
            i += l;
        } else if (i + j == n && !final) {
            return i; /* wait for the rest */
        } else {
            sink_put(k, REPL, 3); /* maximal subpart of an ill-formed sequence */
            i += j;
        }
    }
    return i;
}

static bool strips_space(const struct ty_tokenizer *t)
{
    return t->escape_spaces && t->add_space_prefix;
}

static bool is_special(const struct ty_tokenizer *t, uint32_t id)
{
    int ty = t->types[id];
    return ty == TY_TOK_TYPE_CONTROL || ty == TY_TOK_TYPE_UNKNOWN || ty == TY_TOK_TYPE_UNUSED;
}

int ty_tokenizer_decode(const ty_tokenizer_t *t, const uint32_t *ids, size_t n, bool skip_special,
                        char *buf, size_t cap)
{
    size_t raw_cap = 256, raw_len = 0;
    unsigned char *raw = malloc(raw_cap);
    bool started = false; /* only the first piece loses its leading space */
    if (!raw)
        return TY_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= t->n_vocab) {
            free(raw);
            return TY_EINVAL;
        }
        const char *p;
        size_t l;
        if (is_special(t, ids[i])) {
            if (skip_special)
                continue;
            p = t->text + t->text_off[ids[i]];
            l = t->text_len[ids[i]];
        } else {
            p = t->piece + t->piece_off[ids[i]];
            l = t->piece_len[ids[i]];
            if (!started && l > 0 && p[0] == ' ' && strips_space(t)) {
                p++;
                l--;
            }
        }
        started = started || l > 0 || t->piece_len[ids[i]] > 0;
        if (raw_len + l > raw_cap) {
            while (raw_len + l > raw_cap)
                raw_cap *= 2;
            unsigned char *nr = realloc(raw, raw_cap);
            if (!nr) {
                free(raw);
                return TY_ENOMEM;
            }
            raw = nr;
        }
        memcpy(raw + raw_len, p, l);
        raw_len += l;
    }
    struct sink k = {buf, cap ? cap - 1 : 0, 0};
    utf8_clean(&k, raw, raw_len, true);
    free(raw);
    if (cap)
        buf[k.len < cap - 1 ? k.len : cap - 1] = 0;
    return k.len > (size_t)INT32_MAX ? TY_EOVERFLOW : (int)k.len;
}

void ty_detok_init(struct ty_detok *d, const ty_tokenizer_t *tok)
{
    memset(d, 0, sizeof(*d));
    d->tok = tok;
}

/* Run pending + piece through the checker into out; commit state only when it fits. */
static int detok_step(struct ty_detok *d, const char *p, size_t l, bool final, char *out,
                      size_t cap)
{
    unsigned char local[128];
    size_t n = d->n_pending + l;
    unsigned char *tmp = n <= sizeof(local) ? local : malloc(n);
    if (!tmp)
        return TY_ENOMEM;
    memcpy(tmp, d->pending, d->n_pending);
    memcpy(tmp + d->n_pending, p, l);
    struct sink k = {out, cap ? cap - 1 : 0, 0};
    size_t used = utf8_clean(&k, tmp, n, final);
    int rc;
    if (k.len > k.cap || cap == 0) {
        rc = TY_ERANGE;
    } else {
        out[k.len] = 0;
        d->n_pending = (uint32_t)(n - used); /* at most 3: an incomplete sequence */
        memcpy(d->pending, tmp + used, d->n_pending);
        d->n_out += k.len;
        rc = (int)k.len;
    }
    if (tmp != local)
        free(tmp);
    return rc;
}

int ty_detok_feed(struct ty_detok *d, uint32_t id, char *out, size_t cap)
{
    const struct ty_tokenizer *t = d->tok;
    if (id >= t->n_vocab)
        return TY_EINVAL;
    size_t l;
    const char *p = ty_tokenizer_piece(t, id, &l);
    bool strip = !d->started && l > 0 && p[0] == ' ' && strips_space(t);
    int rc = detok_step(d, p + strip, l - strip, false, out, cap);
    if (rc >= 0) {
        d->n_fed++;
        d->started = d->started || l > 0;
    }
    return rc;
}

int ty_detok_flush(struct ty_detok *d, char *out, size_t cap)
{
    return detok_step(d, "", 0, true, out, cap);
}
