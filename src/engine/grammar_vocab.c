/* The vocabulary index and the per-sequence matcher (tycho/grammar.h).
 *
 * The trie is stored in preorder: node i's subtree is [i, end), its first child i + 1, so a
 * walk that rejects a byte jumps to `end` and one that backtracks truncates the frame pool to
 * where the parent level began. Tokens that stay inside a plain string (no '"', '\\' or
 * control byte, UTF-8 that is valid from a character boundary) are a precomputed bit set;
 * tokens holding '"' or '\\' are listed apart and checked one by one. */
#include "grammar-impl.h"

#include "tycho/errors.h"
#ifdef TY_HAVE_TOKENIZER
#include "tycho/tokenizer.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_CACHE 16
#define COMPACT_FRAMES 65536

struct tnode {
    uint32_t end;  /* one past the subtree */
    int32_t token; /* a token ending here, -1: none (more in vocab->dup) */
    uint8_t byte;
};

struct ty_grammar_vocab {
    uint32_t n;            /* tokens */
    size_t words;          /* mask words */
    struct tnode *t;       /* preorder trie; t[0] is the root (no byte) */
    uint32_t n_t, max_len;
    int32_t *dup;          /* [token] next token with the same bytes, -1: none */
    uint32_t *str_safe[4]; /* masks: tokens that stay in a plain string, by the UTF-8
                            * continuation bytes they leave pending */
    uint32_t *special;     /* tokens holding '"' or '\\' */
    uint16_t *chars;       /* [token] characters it starts (string-safe ones) */
    uint32_t n_special;
    uint32_t *eog, n_eog;
    char **bytes;          /* [token] its bytes (NULL: never admitted) */
    uint32_t *len;
};

struct gcache {
    uint64_t key;
    uint32_t maxinc; /* largest shortest-completion after an allowed token */
    int allowed;
    bool used;
};

struct ty_grammar_matcher {
    const ty_grammar_t *g;
    const ty_grammar_vocab_t *v;
    struct gpool pool;
    struct gstate cur;
    struct gstate *lv;   /* walk levels, (max_len + 1) */
    uint32_t *lv_mark;   /* pool size when the level began */
    uint32_t *lv_end;    /* subtree end of the level's node */
    struct gcache cache[N_CACHE];
    uint32_t *cache_mask; /* (N_CACHE, words) */
    uint32_t cache_next;
};

/* ---- the vocabulary ---------------------------------------------------------------------- */

struct skey {
    const char *b;
    uint32_t len, id;
};

static int cmp_tok(const void *a, const void *b)
{
    const struct skey *x = a, *y = b;
    int c = memcmp(x->b, y->b, x->len < y->len ? x->len : y->len);
    if (c)
        return c;
    return x->len != y->len ? (x->len < y->len ? -1 : 1) : (x->id < y->id ? -1 : 1);
}

/* Pending continuation bytes after s inside a plain string, -1: s does not stay in one. */
static int string_safe(const char *s, uint32_t n)
{
    uint16_t aux = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (!(aux & 3) && (c == '"' || c == '\\'))
            return -1;
        if (!ty__grammar_utf8_step(&aux, c))
            return -1;
    }
    return aux & 3;
}

/* Build the preorder trie from the tokens sorted by bytes. */
static int trie_build(ty_grammar_vocab_t *v, const uint32_t *ids, uint32_t n_ids)
{
    size_t total = 1;
    for (uint32_t i = 0; i < n_ids; i++)
        total += v->len[ids[i]];
    if (!(v->t = malloc(total * sizeof(*v->t))))
        return TY_ENOMEM;
    uint32_t path[v->max_len + 1], depth = 0, prev = G_NONE;
    v->t[0] = (struct tnode){.token = -1};
    v->n_t = 1;
    path[0] = 0;
    for (uint32_t k = 0; k < n_ids; k++) {
        uint32_t id = ids[k], l = 0, len = v->len[id];
        if (prev != G_NONE) {
            uint32_t pl = v->len[prev];
            while (l < len && l < pl && v->bytes[id][l] == v->bytes[prev][l])
                l++;
            if (l == len && l == pl) { /* same bytes: chain it */
                int32_t *d = &v->dup[prev];
                while (*d >= 0)
                    d = &v->dup[*d];
                *d = (int32_t)id;
                continue;
            }
        }
        while (depth > l)
            v->t[path[depth--]].end = v->n_t;
        for (; l < len; l++) {
            v->t[v->n_t] = (struct tnode){.token = -1, .byte = (uint8_t)v->bytes[id][l]};
            path[++depth] = v->n_t++;
        }
        v->t[path[depth]].token = (int32_t)id;
        prev = id;
    }
    while (depth > 0)
        v->t[path[depth--]].end = v->n_t;
    v->t[0].end = v->n_t;
    return 0;
}

static int vocab_index(ty_grammar_vocab_t *v)
{
    uint32_t *ids = malloc((v->n ? v->n : 1) * sizeof(uint32_t)), n_ids = 0;
    v->dup = malloc((v->n ? v->n : 1) * sizeof(int32_t));
    v->words = (v->n + 31) / 32;
    bool ok = true;
    for (int k = 0; k < 4; k++)
        ok = ok && (v->str_safe[k] = calloc(v->words ? v->words : 1, sizeof(uint32_t)));
    v->special = malloc((v->n ? v->n : 1) * sizeof(uint32_t));
    v->chars = calloc(v->n ? v->n : 1, sizeof(uint16_t));
    if (!ids || !v->dup || !ok || !v->special || !v->chars) {
        free(ids);
        return TY_ENOMEM;
    }
    for (uint32_t i = 0; i < v->n; i++) {
        v->dup[i] = -1;
        if (!v->bytes[i])
            continue;
        ids[n_ids++] = i;
        v->max_len = v->len[i] > v->max_len ? v->len[i] : v->max_len;
        int pend = string_safe(v->bytes[i], v->len[i]);
        if (pend >= 0)
            v->str_safe[pend][i / 32] |= 1u << (i % 32);
        for (uint32_t j = 0; pend >= 0 && j < v->len[i]; j++)
            v->chars[i] += ((uint8_t)v->bytes[i][j] & 0xC0) != 0x80;
        bool quote = memchr(v->bytes[i], '"', v->len[i]) || memchr(v->bytes[i], '\\', v->len[i]);
        if (pend < 0 && quote)
            v->special[v->n_special++] = i;
    }
    struct skey *keys = malloc((n_ids ? n_ids : 1) * sizeof(*keys));
    if (!keys) {
        free(ids);
        return TY_ENOMEM;
    }
    for (uint32_t k = 0; k < n_ids; k++)
        keys[k] = (struct skey){.b = v->bytes[ids[k]], .len = v->len[ids[k]], .id = ids[k]};
    qsort(keys, n_ids, sizeof(*keys), cmp_tok);
    for (uint32_t k = 0; k < n_ids; k++)
        ids[k] = keys[k].id;
    free(keys);
    int rc = trie_build(v, ids, n_ids);
    free(ids);
    return rc;
}

int ty_grammar_vocab_new_pieces(ty_grammar_vocab_t **out, const char *const *pieces,
                                const size_t *lens, uint32_t n, const uint32_t *eog,
                                size_t n_eog)
{
    ty_grammar_vocab_t *v = calloc(1, sizeof(*v));
    if (!v)
        return TY_ENOMEM;
    v->n = n;
    v->bytes = calloc(n ? n : 1, sizeof(char *));
    v->len = calloc(n ? n : 1, sizeof(uint32_t));
    v->eog = malloc((n_eog ? n_eog : 1) * sizeof(uint32_t));
    int rc = v->bytes && v->len && v->eog ? 0 : TY_ENOMEM;
    for (size_t i = 0; i < n_eog && !rc; i++)
        if (eog[i] < n)
            v->eog[v->n_eog++] = eog[i];
    for (uint32_t i = 0; i < n && !rc; i++) {
        bool is_eog = false;
        for (uint32_t k = 0; k < v->n_eog; k++)
            is_eog = is_eog || v->eog[k] == i;
        if (!lens[i] || is_eog || lens[i] > 4096)
            continue;
        if (!(v->bytes[i] = malloc(lens[i])))
            rc = TY_ENOMEM;
        else
            memcpy(v->bytes[i], pieces[i], lens[i]);
        v->len[i] = (uint32_t)lens[i];
    }
    rc = rc ? rc : vocab_index(v);
    if (rc) {
        ty_grammar_vocab_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

int ty_grammar_vocab_new(ty_grammar_vocab_t **out, const struct ty_tokenizer *tok)
{
#ifdef TY_HAVE_TOKENIZER
    if (!out || !tok)
        return TY_EINVAL;
    uint32_t n = ty_tokenizer_n_vocab(tok), n_eog = 0;
    const char **pieces = malloc((n ? n : 1) * sizeof(char *));
    size_t *lens = malloc((n ? n : 1) * sizeof(size_t));
    uint32_t *eog = malloc((n ? n : 1) * sizeof(uint32_t));
    int rc = pieces && lens && eog ? 0 : TY_ENOMEM;
    for (uint32_t i = 0; i < n && !rc; i++) {
        pieces[i] = ty_tokenizer_piece(tok, i, &lens[i]);
        if (ty_tokenizer_is_eog(tok, i))
            eog[n_eog++] = i;
    }
    rc = rc ? rc : ty_grammar_vocab_new_pieces(out, pieces, lens, n, eog, n_eog);
    free(pieces);
    free(lens);
    free(eog);
    return rc;
#else
    (void)out;
    (void)tok;
    return TY_ENOTSUP;
#endif
}

void ty_grammar_vocab_free(ty_grammar_vocab_t *v)
{
    if (!v)
        return;
    for (uint32_t i = 0; v->bytes && i < v->n; i++)
        free(v->bytes[i]);
    free(v->bytes);
    free(v->len);
    free(v->t);
    free(v->dup);
    for (int k = 0; k < 4; k++)
        free(v->str_safe[k]);
    free(v->special);
    free(v->chars);
    free(v->eog);
    free(v);
}

uint32_t ty_grammar_vocab_size(const ty_grammar_vocab_t *v)
{
    return v->n;
}

size_t ty_grammar_mask_words(const ty_grammar_vocab_t *v)
{
    return v->words;
}

/* ---- the matcher ------------------------------------------------------------------------- */

int ty_grammar_matcher_new(ty_grammar_matcher_t **out, const ty_grammar_t *g,
                           const ty_grammar_vocab_t *v)
{
    ty_grammar_matcher_t *m = calloc(1, sizeof(*m));
    if (!m)
        return TY_ENOMEM;
    m->g = g;
    m->v = v;
    m->lv = malloc((v->max_len + 2) * sizeof(*m->lv));
    m->lv_mark = malloc((v->max_len + 2) * sizeof(uint32_t));
    m->lv_end = malloc((v->max_len + 2) * sizeof(uint32_t));
    m->cache_mask = malloc((size_t)N_CACHE * (v->words ? v->words : 1) * sizeof(uint32_t));
    int rc = m->lv && m->lv_mark && m->lv_end && m->cache_mask ? 0 : TY_ENOMEM;
    rc = rc ? rc : ty__grammar_start(g, &m->pool, &m->cur);
    if (rc) {
        ty_grammar_matcher_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void ty_grammar_matcher_free(ty_grammar_matcher_t *m)
{
    if (!m)
        return;
    free(m->pool.f);
    free(m->lv);
    free(m->lv_mark);
    free(m->lv_end);
    free(m->cache_mask);
    free(m);
}

static void set_token(const ty_grammar_vocab_t *v, uint32_t *mask, int32_t id, int *count)
{
    for (; id >= 0; id = v->dup[id]) {
        mask[id / 32] |= 1u << (id % 32);
        (*count)++;
    }
}

/* Walk the trie from the current state: a token is allowed when the state after it has a
 * completion of at most `limit` bytes. *maxinc: the largest such completion; *cut: a token was
 * refused for its completion alone. */
static int walk(ty_grammar_matcher_t *m, uint32_t limit, uint32_t *mask, uint32_t *maxinc,
                bool *cut)
{
    const ty_grammar_vocab_t *v = m->v;
    struct gpool *p = &m->pool;
    uint32_t base = p->n, d = 0;
    int count = 0, rc = 0;
    m->lv[0] = m->cur;
    m->lv_mark[0] = base;
    m->lv_end[0] = v->n_t;
    for (uint32_t i = 1; i < v->n_t && !rc;) {
        while (i >= m->lv_end[d]) {
            p->n = m->lv_mark[d];
            d--;
        }
        const struct tnode *t = &v->t[i];
        uint32_t mark = p->n;
        if ((rc = ty__grammar_step(m->g, p, &m->lv[d], t->byte, &m->lv[d + 1])))
            break;
        if (!m->lv[d + 1].n) {
            p->n = mark;
            i = t->end;
            continue;
        }
        if (t->token >= 0) {
            uint32_t mc = ty__grammar_min_close(m->g, p, &m->lv[d + 1]);
            if (mc <= limit) {
                set_token(v, mask, t->token, &count);
                *maxinc = mc > *maxinc ? mc : *maxinc;
            } else {
                *cut = true;
            }
        }
        d++;
        m->lv_mark[d] = mark;
        m->lv_end[d] = t->end;
        i++;
    }
    p->n = base;
    return rc ? rc : count;
}

/* Inside a string: the string-safe sets whose pending UTF-8 bytes still fit the limit (`room`
 * bytes beyond the shortest completion now; staying in the string shortens the rest otherwise)
 * and whose characters fit `chars`, then the tokens with '"' or '\\' one by
 * one. */
static int fill_in_string(ty_grammar_matcher_t *m, uint32_t limit, uint32_t room, uint32_t chars,
                          uint32_t *mask)
{
    const ty_grammar_vocab_t *v = m->v;
    struct gpool *p = &m->pool;
    uint32_t base = p->n;
    int count = 0;
    memset(mask, 0, v->words * sizeof(uint32_t));
    for (uint32_t k = 0; k < 4 && k <= room; k++)
        for (size_t w = 0; w < v->words; w++)
            mask[w] |= v->str_safe[k][w];
    if (chars != UINT32_MAX) /* a length limit: tokens of too many characters go */
        for (size_t w = 0; w < v->words; w++)
            for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
                uint32_t id = (uint32_t)(w * 32 + (uint32_t)__builtin_ctz(bits));
                if (v->chars[id] > chars)
                    mask[w] &= ~(1u << (id % 32));
            }
    for (size_t w = 0; w < v->words; w++)
        count += __builtin_popcount(mask[w]);
    struct gstate *a = &m->lv[0], *b = &m->lv[1];
    for (uint32_t k = 0; k < v->n_special; k++) {
        uint32_t id = v->special[k];
        *a = m->cur;
        for (uint32_t j = 0; j < v->len[id] && a->n; j++) {
            int rc = ty__grammar_step(m->g, p, a, (uint8_t)v->bytes[id][j], b);
            if (rc) {
                p->n = base;
                return rc;
            }
            struct gstate *t = a;
            a = b;
            b = t;
        }
        if (a->n && ty__grammar_min_close(m->g, p, a) <= limit) {
            mask[id / 32] |= 1u << (id % 32);
            count++;
        }
        p->n = base;
    }
    return count;
}

static struct gcache *cache_find(ty_grammar_matcher_t *m, uint64_t key)
{
    for (int i = 0; i < N_CACHE; i++)
        if (m->cache[i].used && m->cache[i].key == key)
            return &m->cache[i];
    return NULL;
}

static int fill_limited(ty_grammar_matcher_t *m, uint32_t limit, uint32_t *mask)
{
    const ty_grammar_vocab_t *v = m->v;
    memset(mask, 0, v->words * sizeof(uint32_t));
    uint32_t mc = ty__grammar_min_close(m->g, &m->pool, &m->cur);
    uint32_t chars;
    if (mc <= limit && ty__grammar_in_plain_string(m->g, &m->pool, &m->cur, &chars))
        return fill_in_string(m, limit, limit - mc, chars, mask);
    uint64_t key = ty__grammar_state_hash(&m->pool, &m->cur);
    struct gcache *c = cache_find(m, key);
    if (c && c->maxinc <= limit) {
        memcpy(mask, m->cache_mask + (size_t)(c - m->cache) * v->words,
               v->words * sizeof(uint32_t));
        return c->allowed;
    }
    uint32_t maxinc = 0;
    bool cut = false;
    int n = walk(m, limit, mask, &maxinc, &cut);
    if (n >= 0 && !cut) {
        c = &m->cache[m->cache_next];
        m->cache_next = (m->cache_next + 1) % N_CACHE;
        *c = (struct gcache){.key = key, .maxinc = maxinc, .allowed = n, .used = true};
        memcpy(m->cache_mask + (size_t)(c - m->cache) * v->words, mask,
               v->words * sizeof(uint32_t));
    }
    return n;
}

int ty_grammar_matcher_fill_mask(ty_grammar_matcher_t *m, uint32_t budget, uint32_t *mask)
{
    uint32_t limit = budget == UINT32_MAX ? G_INF : budget ? budget - 1 : 0;
    int n = fill_limited(m, limit, mask);
    uint32_t mc = ty__grammar_min_close(m->g, &m->pool, &m->cur);
    if (n == 0 && mc > 0 && mc < G_INF && limit < mc)
        n = fill_limited(m, mc - 1, mask); /* the budget cannot be met: get closer */
    if (n >= 0 && ty__grammar_complete(m->g, &m->pool, &m->cur))
        for (uint32_t k = 0; k < m->v->n_eog; k++) {
            mask[m->v->eog[k] / 32] |= 1u << (m->v->eog[k] % 32);
            n++;
        }
    return n;
}

int ty_grammar_matcher_accept_bytes(ty_grammar_matcher_t *m, const char *s, size_t n)
{
    struct gpool *p = &m->pool;
    uint32_t base = p->n;
    struct gstate a = m->cur, b;
    for (size_t j = 0; j < n; j++) {
        int rc = ty__grammar_step(m->g, p, &a, (uint8_t)s[j], &b);
        if (rc || !b.n) {
            p->n = base;
            return rc ? rc : TY_EINVAL;
        }
        a = b;
    }
    m->cur = a;
    if (p->n > COMPACT_FRAMES)
        return ty__grammar_state_compact(p, &m->cur);
    return 0;
}

int ty_grammar_matcher_accept(ty_grammar_matcher_t *m, uint32_t id)
{
    const ty_grammar_vocab_t *v = m->v;
    if (id >= v->n)
        return TY_EINVAL;
    for (uint32_t k = 0; k < v->n_eog; k++)
        if (v->eog[k] == id)
            return ty_grammar_matcher_is_complete(m) ? 0 : TY_EINVAL;
    if (!v->bytes[id])
        return TY_EINVAL;
    return ty_grammar_matcher_accept_bytes(m, v->bytes[id], v->len[id]);
}

bool ty_grammar_matcher_is_complete(const ty_grammar_matcher_t *m)
{
    return ty__grammar_complete(m->g, &m->pool, &m->cur);
}

uint32_t ty_grammar_matcher_min_close(const ty_grammar_matcher_t *m)
{
    return ty__grammar_min_close(m->g, &m->pool, &m->cur);
}

void ty_grammar_mask_apply(const uint32_t *mask, uint32_t n_mask_bits, float *logits, uint32_t n)
{
    for (uint32_t w = 0; w * 32 < n; w++) {
        uint32_t bits = w * 32 < n_mask_bits ? mask[w] : 0;
        if (w * 32 + 32 > n_mask_bits && w * 32 < n_mask_bits)
            bits &= (n_mask_bits % 32) ? (1u << (n_mask_bits % 32)) - 1 : ~0u;
        if (bits == ~0u)
            continue;
        uint32_t end = w * 32 + 32 < n ? w * 32 + 32 : n;
        for (uint32_t i = w * 32; i < end; i++)
            if (!(bits >> (i % 32) & 1))
                logits[i] = -INFINITY;
    }
}
