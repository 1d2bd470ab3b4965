/* The two merge models over a linked list of symbols and a binary heap of candidate pairs,
 * so a pre-token of n bytes costs O(n log n), not O(n^2):
 *  - SPM (llama.cpp llm_tokenizer_spm): symbols are UTF-8 characters; any adjacent pair whose
 *    concatenation is a token is a candidate, highest score first, leftmost on ties; symbols
 *    left that are not tokens become <0xNN> byte tokens.
 *  - BPE (HF tokenizers models/bpe): symbols are tokens (GPT-2 byte-level characters, or UTF-8
 *    characters with byte fallback); only listed merges apply, lowest rank first.
 */
#include "tok-impl.h"

#include <stdlib.h>
#include <string.h>

#include "tycho/errors.h"

struct sym {
    int32_t id;   /* token id; -1 unknown (byte fallback / unk); -2 merged away */
    int32_t prev, next;
    uint32_t start, len; /* bytes of the pre-token */
};

struct cand {
    uint64_t key; /* smaller pops first */
    uint32_t l, r;
    int32_t lid, rid; /* BPE: ids expected at l and r; SPM: lid = byte size of the pair */
};

struct heap {
    struct cand *v;
    size_t n, cap;
};

static int heap_push(struct heap *h, struct cand c)
{
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        struct cand *nv = realloc(h->v, nc * sizeof(*nv));
        if (!nv)
            return TY_ENOMEM;
        h->v = nv;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0 && h->v[(i - 1) / 2].key > c.key) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = c;
    return 0;
}

static struct cand heap_pop(struct heap *h)
{
    struct cand top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->v[c + 1].key < h->v[c].key)
            c++;
        if (h->v[c].key >= last.key)
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n)
        h->v[i] = last;
    return top;
}

/* Split s into UTF-8 character symbols, linked. */
static struct sym *make_syms(const char *s, size_t n, size_t *count)
{
    struct sym *y = malloc(sizeof(*y) * (n ? n : 1));
    if (!y)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t l = ty__tok_utf8_len((const unsigned char *)s + i, n - i);
        y[k] = (struct sym){-1, (int32_t)k - 1, (int32_t)k + 1, (uint32_t)i, (uint32_t)l};
        k++;
        i += l;
    }
    y[k - 1].next = -1;
    *count = k;
    return y;
}

static int push_bytes(const struct ty_tokenizer *t, const char *s, size_t n, struct ty_tok_ids *o)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_ids[(unsigned char)s[i]];
        if (id < 0)
            id = t->unk_id;
        if (id < 0)
            continue;
        int rc = ty__tok_ids_push(o, (uint32_t)id);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- SPM ---- */

static uint32_t score_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* order-preserving */
}

static int spm_try(const struct ty_tokenizer *t, const char *s, struct sym *y, int32_t l,
                   int32_t r, struct heap *h)
{
    if (l < 0 || r < 0)
        return 0;
    uint32_t size = y[l].len + y[r].len;
    int32_t id = ty__tok_lookup(t, s + y[l].start, size);
    if (id < 0)
        return 0;
    uint64_t key = ((uint64_t)(~score_key(t->scores[id])) << 32) | (uint32_t)l;
    return heap_push(h, (struct cand){key, (uint32_t)l, (uint32_t)r, (int32_t)size, id});
}

int ty__tok_spm_encode(const struct ty_tokenizer *t, const char *s, size_t n,
                       struct ty_tok_ids *out)
{
    size_t k;
    struct heap h = {0};
    struct sym *y = make_syms(s, n, &k);
    int rc = 0;
    if (!y)
        return TY_ENOMEM;
    for (size_t i = 1; i < k && !rc; i++)
        rc = spm_try(t, s, y, (int32_t)i - 1, (int32_t)i, &h);
    while (h.n && !rc) {
        struct cand c = heap_pop(&h);
        struct sym *a = &y[c.l], *b = &y[c.r];
        if (a->len == 0 || b->len == 0 || a->len + b->len != (uint32_t)c.lid)
            continue; /* stale */
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0)
            y[b->next].prev = (int32_t)c.l;
        rc = spm_try(t, s, y, a->prev, (int32_t)c.l, &h);
        if (!rc)
            rc = spm_try(t, s, y, (int32_t)c.l, a->next, &h);
    }
    for (int32_t i = 0; i != -1 && !rc; i = y[i].next) {
        int32_t id = ty__tok_lookup(t, s + y[i].start, y[i].len);
        rc = id >= 0 ? ty__tok_ids_push(out, (uint32_t)id)
                     : push_bytes(t, s + y[i].start, y[i].len, out);
    }
    free(h.v);
    free(y);
    return rc;
}

/* ---- BPE ---- */

static const struct ty_tok_merge *merge_find(const struct ty_tokenizer *t, uint32_t l, uint32_t r)
{
    if (!t->merge_cap)
        return NULL;
    uint64_t key = (((uint64_t)l << 32) | r) + 1;
    uint64_t x = key;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    uint32_t mask = t->merge_cap - 1;
    for (uint32_t i = (uint32_t)x & mask;; i = (i + 1) & mask) {
        if (t->merges[i].key == key)
            return &t->merges[i];
        if (t->merges[i].key == 0)
            return NULL;
    }
}

static int bpe_try(const struct ty_tokenizer *t, struct sym *y, int32_t l, int32_t r,
                   struct heap *h)
{
    if (l < 0 || r < 0 || y[l].id < 0 || y[r].id < 0)
        return 0;
    const struct ty_tok_merge *m = merge_find(t, (uint32_t)y[l].id, (uint32_t)y[r].id);
    if (!m)
        return 0;
    uint64_t key = ((uint64_t)m->rank << 32) | (uint32_t)l;
    return heap_push(h, (struct cand){key, (uint32_t)l, (uint32_t)r, y[l].id, y[r].id});
}

/* Initial symbols: GPT-2 byte-level (one per byte) or UTF-8 characters (byte fallback). */
static struct sym *bpe_syms(const struct ty_tokenizer *t, const char *s, size_t n, size_t *k)
{
    struct sym *y;
    if (t->byte_fallback) {
        y = make_syms(s, n, k);
        for (size_t i = 0; y && i < *k; i++)
            y[i].id = ty__tok_lookup(t, s + y[i].start, y[i].len);
        return y;
    }
    y = malloc(sizeof(*y) * n);
    if (!y)
        return NULL;
    for (size_t i = 0; i < n; i++)
        y[i] = (struct sym){t->byte_ids[(unsigned char)s[i]], (int32_t)i - 1,
                            i + 1 < n ? (int32_t)i + 1 : -1, (uint32_t)i, 1};
    *k = n;
    return y;
}

/* HF ignore_merges: a whole pre-token that is a token is emitted as is. */
static int32_t bpe_whole(const struct ty_tokenizer *t, const char *s, size_t n)
{
    if (t->byte_fallback || n == 0)
        return ty__tok_lookup(t, s, n);
    char local[256];
    char *m = n * 2 <= sizeof(local) ? local : malloc(n * 2);
    if (!m)
        return -1;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = ty__tok_byte_to_cp((uint8_t)s[i]);
        if (cp < 0x80) {
            m[w++] = (char)cp;
        } else {
            m[w++] = (char)(0xC0 | (cp >> 6));
            m[w++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    int32_t id = ty__tok_lookup(t, m, w);
    if (m != local)
        free(m);
    return id;
}

static int bpe_emit(const struct ty_tokenizer *t, const char *s, struct sym *y,
                    struct ty_tok_ids *out)
{
    int rc = 0;
    bool prev_unk = false;
    for (int32_t i = 0; i != -1 && !rc; i = y[i].next) {
        if (y[i].id >= 0) {
            rc = ty__tok_ids_push(out, (uint32_t)y[i].id);
            prev_unk = false;
        } else if (t->byte_fallback && t->byte_ids[(unsigned char)s[y[i].start]] >= 0) {
            rc = push_bytes(t, s + y[i].start, y[i].len, out);
        } else if (t->unk_id >= 0 && !prev_unk) { /* fuse consecutive unknowns (fuse_unk) */
            rc = ty__tok_ids_push(out, (uint32_t)t->unk_id);
            prev_unk = true;
        }
    }
    return rc;
}

int ty__tok_bpe_encode(const struct ty_tokenizer *t, const char *s, size_t n,
                       struct ty_tok_ids *out)
{
    if (t->ignore_merges) {
        int32_t id = bpe_whole(t, s, n);
        if (id >= 0)
            return ty__tok_ids_push(out, (uint32_t)id);
    }
    size_t k;
    struct heap h = {0};
    struct sym *y = bpe_syms(t, s, n, &k);
    int rc = 0;
    if (!y)
        return TY_ENOMEM;
    for (size_t i = 1; i < k && !rc; i++)
        rc = bpe_try(t, y, (int32_t)i - 1, (int32_t)i, &h);
    while (h.n && !rc) {
        struct cand c = heap_pop(&h);
        struct sym *a = &y[c.l], *b = &y[c.r];
        if (a->id != c.lid || b->id != c.rid || a->next != (int32_t)c.r)
            continue; /* stale */
        a->id = (int32_t)merge_find(t, (uint32_t)c.lid, (uint32_t)c.rid)->result;
        a->len += b->len;
        b->id = -2;
        a->next = b->next;
        if (b->next >= 0)
            y[b->next].prev = (int32_t)c.l;
        rc = bpe_try(t, y, a->prev, (int32_t)c.l, &h);
        if (!rc)
            rc = bpe_try(t, y, (int32_t)c.l, a->next, &h);
    }
    if (!rc)
        rc = bpe_emit(t, s, y, out);
    free(h.v);
    free(y);
    return rc;
}
