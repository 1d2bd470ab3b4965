/* KV page pool: page memory (host, or a backend's through ty_kvpool_storage), reference
 * counts, free list, a prefix index (open addressing, chained block hash -> page id) and
 * per-sequence block tables.
 *
 * Prefix cache: a full, indexed block whose last sequence lets go keeps its page and its index
 * entry; the page waits on an LRU list ("cached") and a later prompt with that prefix takes
 * it back. Pages for new tokens come from the free list first, then from the least recently
 * released cached page, whose index entry goes then. Cached pages count as free capacity. */
#include "tycho/kvpool.h"

#include "tycho/errors.h"
#include "tycho/hash.h"
#include "tycho/log.h"

#include <stdlib.h>
#include <string.h>

#define NO_PAGE TY_KVPOOL_NO_PAGE

struct ty_kvseq {
    uint32_t *pages; /* block table */
    uint32_t n_pages, cap_pages;
    uint32_t *tokens; /* tokens whose KV is (or is being) stored */
    uint32_t n_tokens, cap_tokens;
    uint32_t n_hashed;   /* full blocks whose chain hash is known */
    uint64_t last_hash;  /* chain hash of block n_hashed - 1 */
    uint32_t n_pending;  /* import: tokens reserved but not yet valid */
    uint32_t n_released; /* leading block table entries given back (NO_PAGE) */
    bool priv;           /* never indexed (ty_kvpool_seq_set_private) */
};

struct slot {
    uint64_t hash;
    uint32_t page; /* NO_PAGE: empty; tombstones keep hash with page = NO_PAGE - 1 */
};
#define TOMB (NO_PAGE - 1)

struct ty_kvpool {
    struct ty_kvpool_opts o;
    struct ty_kvpool_storage st; /* alloc == NULL: host memory */
    size_t page_bytes;  /* n_kv_heads * B * head_dim * element size */
    unsigned char **k, **v; /* [layer] -> (n_pages, n_kv_heads, B, head_dim) elements */
    uint32_t *ref;      /* [page] */
    uint64_t *page_hash;
    bool *page_indexed;
    uint32_t *free_list;
    uint32_t n_free;
    uint32_t *lru_prev, *lru_next; /* [page]: cached pages, head = least recently released */
    uint32_t lru_head, lru_tail, n_cached;
    struct slot *idx;
    uint32_t idx_cap; /* power of two, >= 2 * n_pages */
    uint32_t n_tombs; /* tombstones in idx: rebuilt when they pile up */
};

const char *ty_kv_dtype_name(enum ty_kv_dtype t)
{
    return t == TY_KV_F16 ? "f16" : t == TY_KV_BF16 ? "bf16" : "f32";
}

int ty_kv_dtype_parse(const char *s, enum ty_kv_dtype *out)
{
    if (s && !strcmp(s, "f32"))
        *out = TY_KV_F32;
    else if (s && !strcmp(s, "f16"))
        *out = TY_KV_F16;
    else if (s && !strcmp(s, "bf16"))
        *out = TY_KV_BF16;
    else
        return TY_EINVAL;
    return 0;
}

size_t ty_kv_dtype_size(enum ty_kv_dtype t)
{
    return t == TY_KV_F32 ? 4 : 2;
}

static void *page_alloc(ty_kvpool_t *p, size_t bytes)
{
    return p->st.alloc ? p->st.alloc(p->st.ctx, bytes) : calloc(1, bytes);
}

static void page_release(ty_kvpool_t *p, void *ptr)
{
    if (ptr && p->st.alloc)
        p->st.free(p->st.ctx, ptr);
    else
        free(ptr);
}

int ty_kvpool_new(ty_kvpool_t **out, const struct ty_kvpool_opts *opts)
{
    *out = NULL;
    struct ty_kvpool_opts o = *opts;
    if (!o.block_tokens)
        o.block_tokens = 64;
    if (!o.n_layers || !o.n_kv_heads || !o.head_dim || !o.n_pages || o.n_pages > (1u << 28) ||
        o.block_tokens > 65536 || (uint32_t)o.dtype > TY_KV_BF16 ||
        (o.storage && (!o.storage->alloc || !o.storage->free ||
                       (!o.storage->copy && !o.storage->host))))
        return TY_EINVAL;
    ty_kvpool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return TY_ENOMEM;
    p->o = o;
    p->o.storage = NULL;
    if (o.storage)
        p->st = *o.storage;
    p->page_bytes = (size_t)o.n_kv_heads * o.block_tokens * o.head_dim * ty_kv_dtype_size(o.dtype);
    p->k = calloc(o.n_layers, sizeof(*p->k));
    p->v = calloc(o.n_layers, sizeof(*p->v));
    p->ref = calloc(o.n_pages, sizeof(uint32_t));
    p->page_hash = calloc(o.n_pages, sizeof(uint64_t));
    p->page_indexed = calloc(o.n_pages, sizeof(bool));
    p->free_list = malloc(o.n_pages * sizeof(uint32_t));
    p->lru_prev = malloc(o.n_pages * sizeof(uint32_t));
    p->lru_next = malloc(o.n_pages * sizeof(uint32_t));
    p->lru_head = p->lru_tail = NO_PAGE;
    p->idx_cap = 16;
    while (p->idx_cap < 2 * o.n_pages)
        p->idx_cap *= 2;
    p->idx = malloc(p->idx_cap * sizeof(struct slot));
    if (!p->k || !p->v || !p->ref || !p->page_hash || !p->page_indexed || !p->free_list ||
        !p->lru_prev || !p->lru_next || !p->idx)
        goto err;
    for (uint32_t l = 0; l < o.n_layers; l++) {
        p->k[l] = page_alloc(p, o.n_pages * p->page_bytes);
        p->v[l] = page_alloc(p, o.n_pages * p->page_bytes);
        if (!p->k[l] || !p->v[l])
            goto err;
    }
    for (uint32_t i = 0; i < o.n_pages; i++)
        p->free_list[i] = o.n_pages - 1 - i; /* pop from the end: page 0 first */
    p->n_free = o.n_pages;
    for (uint32_t i = 0; i < p->idx_cap; i++)
        p->idx[i].page = NO_PAGE;
    *out = p;
    return 0;
err:
    ty_kvpool_free(p);
    return TY_ENOMEM;
}

void ty_kvpool_free(ty_kvpool_t *p)
{
    if (!p)
        return;
    for (uint32_t l = 0; l < p->o.n_layers; l++) {
        if (p->k)
            page_release(p, p->k[l]);
        if (p->v)
            page_release(p, p->v[l]);
    }
    free(p->k);
    free(p->v);
    free(p->ref);
    free(p->page_hash);
    free(p->page_indexed);
    free(p->free_list);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->idx);
    free(p);
}

uint64_t ty_kvpool_hash_seed(const ty_kvpool_t *p)
{
    return p->o.hash_seed;
}

uint32_t ty_kvpool_block_tokens(const ty_kvpool_t *p)
{
    return p->o.block_tokens;
}

uint32_t ty_kvpool_pages_total(const ty_kvpool_t *p)
{
    return p->o.n_pages;
}

uint32_t ty_kvpool_pages_used(const ty_kvpool_t *p)
{
    return p->o.n_pages - p->n_free - p->n_cached;
}

uint32_t ty_kvpool_pages_cached(const ty_kvpool_t *p)
{
    return p->n_cached;
}

uint32_t ty_kvpool_pages_free(const ty_kvpool_t *p)
{
    return ty_kvpool_pages_total(p) - ty_kvpool_pages_used(p);
}

size_t ty_kvpool_page_bytes(const ty_kvpool_t *p)
{
    return p->page_bytes;
}

enum ty_kv_dtype ty_kvpool_dtype(const ty_kvpool_t *p)
{
    return p->o.dtype;
}

bool ty_kvpool_is_host(const ty_kvpool_t *p)
{
    return p->st.alloc == NULL || p->st.host;
}

int ty_kvpool_copy_in(ty_kvpool_t *p, void *pool_dst, const void *host_src, size_t n)
{
    if (!ty_kvpool_is_host(p))
        return p->st.copy(p->st.ctx, pool_dst, host_src, n, true);
    memcpy(pool_dst, host_src, n);
    return 0;
}

int ty_kvpool_copy_out(ty_kvpool_t *p, void *host_dst, const void *pool_src, size_t n)
{
    if (!ty_kvpool_is_host(p))
        return p->st.copy(p->st.ctx, host_dst, pool_src, n, false);
    memcpy(host_dst, pool_src, n);
    return 0;
}

void *ty_kvpool_k(ty_kvpool_t *p, uint32_t layer, uint32_t page)
{
    return p->k[layer] + (size_t)page * p->page_bytes;
}

void *ty_kvpool_v(ty_kvpool_t *p, uint32_t layer, uint32_t page)
{
    return p->v[layer] + (size_t)page * p->page_bytes;
}

/* ---- prefix index ---------------------------------------------------------------------- */

static uint32_t idx_find(const ty_kvpool_t *p, uint64_t h)
{
    uint32_t mask = p->idx_cap - 1;
    for (uint32_t i = (uint32_t)h & mask, n = 0; n < p->idx_cap; i = (i + 1) & mask, n++) {
        if (p->idx[i].page == NO_PAGE)
            return NO_PAGE;
        if (p->idx[i].page != TOMB && p->idx[i].hash == h)
            return i;
    }
    return NO_PAGE;
}

bool ty_kvpool_holds(const ty_kvpool_t *p, uint64_t hash)
{
    return !p->o.no_prefix_sharing && idx_find(p, hash) != NO_PAGE;
}

static void idx_put(ty_kvpool_t *p, uint64_t h, uint32_t page)
{
    uint32_t mask = p->idx_cap - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask)
        if (p->idx[i].page == NO_PAGE || p->idx[i].page == TOMB) {
            p->n_tombs -= p->idx[i].page == TOMB;
            p->idx[i] = (struct slot){h, page};
            return;
        }
}

/* Tombstones lengthen every probe, and a long-lived pool makes many (each released or
 * evicted block leaves one): past a quarter of the table, put the live entries back alone. */
static void idx_rebuild(ty_kvpool_t *p)
{
    for (uint32_t i = 0; i < p->idx_cap; i++)
        p->idx[i].page = NO_PAGE;
    p->n_tombs = 0;
    for (uint32_t page = 0; page < p->o.n_pages; page++)
        if (p->page_indexed[page])
            idx_put(p, p->page_hash[page], page);
}

/* Index `page` under `h`. An equal block already indexed keeps its entry (the first one
 * stays shared), so one hash has at most one page and block_cb sees each membership change
 * once: the hash is only reported removed when that one page leaves. */
static void idx_insert(ty_kvpool_t *p, uint64_t h, uint32_t page)
{
    if (idx_find(p, h) != NO_PAGE)
        return;
    if (p->n_tombs > p->idx_cap / 4)
        idx_rebuild(p);
    idx_put(p, h, page);
    p->page_hash[page] = h;
    p->page_indexed[page] = true;
    if (p->o.block_cb)
        p->o.block_cb(p->o.block_arg, h, true);
}

/* Drop page's index entry (it is about to hold other tokens). */
static void idx_remove(ty_kvpool_t *p, uint32_t page)
{
    if (!p->page_indexed[page])
        return;
    uint32_t i = idx_find(p, p->page_hash[page]);
    TY_ASSERT(i != NO_PAGE && p->idx[i].page == page); /* page_indexed <=> its own entry */
    p->idx[i].page = TOMB;
    p->n_tombs++;
    p->page_indexed[page] = false;
    if (p->o.block_cb)
        p->o.block_cb(p->o.block_arg, p->page_hash[page], false);
}

/* ---- cached pages (released, still indexed) ------------------------------------------------ */

static void lru_push(ty_kvpool_t *p, uint32_t page)
{
    p->lru_prev[page] = p->lru_tail;
    p->lru_next[page] = NO_PAGE;
    if (p->lru_tail != NO_PAGE)
        p->lru_next[p->lru_tail] = page;
    else
        p->lru_head = page;
    p->lru_tail = page;
    p->n_cached++;
}

static void lru_remove(ty_kvpool_t *p, uint32_t page)
{
    uint32_t a = p->lru_prev[page], b = p->lru_next[page];
    if (a != NO_PAGE)
        p->lru_next[a] = b;
    else
        p->lru_head = b;
    if (b != NO_PAGE)
        p->lru_prev[b] = a;
    else
        p->lru_tail = a;
    p->n_cached--;
}

/* A page for new tokens: a free one, else the least recently released cached one. */
static uint32_t page_take(ty_kvpool_t *p)
{
    uint32_t page;
    if (p->n_free) {
        page = p->free_list[--p->n_free];
    } else {
        page = p->lru_head;
        lru_remove(p, page);
        idx_remove(p, page);
    }
    p->ref[page] = 1;
    return page;
}

static void page_unref(ty_kvpool_t *p, uint32_t page)
{
    if (--p->ref[page])
        return;
    if (p->page_indexed[page])
        lru_push(p, page); /* keeps its KV and its index entry until the page is needed */
    else
        p->free_list[p->n_free++] = page;
}

/* ---- sequences ------------------------------------------------------------------------- */

int ty_kvpool_seq_new(ty_kvpool_t *p, ty_kvseq_t **out)
{
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : TY_ENOMEM;
}

void ty_kvpool_seq_free(ty_kvpool_t *p, ty_kvseq_t *s)
{
    if (!s)
        return;
    /* deepest block first: a prefix's first blocks are then the most recently released, the
     * last to be evicted (a block is only found through the ones before it) */
    for (uint32_t i = s->n_pages; i-- > s->n_released;)
        page_unref(p, s->pages[i]);
    free(s->pages);
    free(s->tokens);
    free(s);
}

/* Back to an empty sequence: pages released, no tokens. */
static void seq_clear(ty_kvpool_t *p, ty_kvseq_t *s)
{
    for (uint32_t i = s->n_pages; i-- > s->n_released;) /* deepest first, as in seq_free */
        page_unref(p, s->pages[i]);
    s->n_pages = s->n_tokens = s->n_pending = s->n_hashed = s->n_released = 0;
    s->last_hash = 0;
}

static int grow_u32(uint32_t **a, uint32_t *cap, uint32_t need)
{
    if (need <= *cap)
        return 0;
    uint32_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    uint32_t *n = realloc(*a, (size_t)c * sizeof(uint32_t));
    if (!n)
        return TY_ENOMEM;
    *a = n;
    *cap = c;
    return 0;
}

static int push_tokens(ty_kvseq_t *s, const uint32_t *tokens, uint32_t n)
{
    int rc = grow_u32(&s->tokens, &s->cap_tokens, s->n_tokens + s->n_pending + n);
    if (!rc)
        memcpy(s->tokens + s->n_tokens + s->n_pending, tokens, (size_t)n * sizeof(uint32_t));
    return rc;
}

void ty_kvpool_seq_set_private(ty_kvseq_t *s)
{
    s->priv = true;
}

int ty_kvpool_seq_match_prefix(ty_kvpool_t *p, ty_kvseq_t *s, const uint32_t *tokens, size_t n)
{
    uint32_t B = p->o.block_tokens;
    if (s->n_tokens || s->n_pages)
        return TY_EINVAL;
    if (p->o.no_prefix_sharing || s->priv || n < 1)
        return 0;
    size_t max_blocks = (n - 1) / B;
    uint64_t h = 0;
    for (size_t b = 0; b < max_blocks; b++) {
        h = ty_hash_prefix_step(h, b == 0, tokens + b * B, B, p->o.hash_seed);
        uint32_t i = idx_find(p, h);
        if (i == NO_PAGE)
            break;
        int rc = grow_u32(&s->pages, &s->cap_pages, s->n_pages + 1);
        if (!rc)
            rc = push_tokens(s, tokens + b * B, B);
        if (rc)
            return rc;
        uint32_t page = p->idx[i].page;
        if (p->ref[page]++ == 0)
            lru_remove(p, page); /* a cached block comes back */
        s->pages[s->n_pages++] = page;
        s->n_tokens += B;
        s->n_hashed++;
        s->last_hash = h;
    }
    return (int)s->n_tokens;
}

int ty_kvpool_seq_reserve(ty_kvpool_t *p, ty_kvseq_t *s, uint32_t n_new)
{
    uint32_t B = p->o.block_tokens;
    uint64_t total = (uint64_t)s->n_tokens + s->n_pending + n_new;
    uint64_t need = (total + B - 1) / B;
    if (need > s->n_pages + (uint64_t)p->n_free + p->n_cached)
        return TY_ENOCAPACITY;
    int rc = grow_u32(&s->pages, &s->cap_pages, (uint32_t)need);
    if (rc)
        return rc;
    while (s->n_pages < need)
        s->pages[s->n_pages++] = page_take(p);
    return 0;
}

/* Register every newly full block of `s` in the prefix index. */
static void index_full_blocks(ty_kvpool_t *p, ty_kvseq_t *s)
{
    uint32_t B = p->o.block_tokens;
    while (!p->o.no_prefix_sharing && !s->priv && (s->n_hashed + 1) * B <= s->n_tokens) {
        s->last_hash = ty_hash_prefix_step(s->last_hash, s->n_hashed == 0,
                                           s->tokens + s->n_hashed * B, B, p->o.hash_seed);
        idx_insert(p, s->last_hash, s->pages[s->n_hashed]);
        s->n_hashed++;
    }
}

int ty_kvpool_seq_commit(ty_kvpool_t *p, ty_kvseq_t *s, const uint32_t *tokens, uint32_t n)
{
    uint32_t B = p->o.block_tokens;
    if (s->n_pending || ((uint64_t)s->n_tokens + n + B - 1) / B > s->n_pages)
        return TY_EINVAL; /* not reserved */
    int rc = push_tokens(s, tokens, n);
    if (rc)
        return rc;
    s->n_tokens += n;
    index_full_blocks(p, s);
    return 0;
}

uint32_t ty_kvpool_seq_release_before(ty_kvpool_t *p, ty_kvseq_t *s, uint32_t pos)
{
    uint32_t B = p->o.block_tokens, upto = (pos < s->n_tokens ? pos : s->n_tokens) / B;
    uint32_t n = 0;
    for (; s->n_released < upto; s->n_released++, n++) {
        page_unref(p, s->pages[s->n_released]);
        s->pages[s->n_released] = NO_PAGE;
    }
    return n;
}

uint32_t ty_kvseq_n_released(const ty_kvseq_t *s)
{
    return s->n_released;
}

uint32_t ty_kvseq_n_tokens(const ty_kvseq_t *s)
{
    return s->n_tokens;
}

const uint32_t *ty_kvseq_tokens(const ty_kvseq_t *s)
{
    return s->tokens;
}

uint32_t ty_kvseq_n_pages(const ty_kvseq_t *s)
{
    return s->n_pages;
}

const uint32_t *ty_kvseq_pages(const ty_kvseq_t *s)
{
    return s->pages;
}

/* ---- export / import ------------------------------------------------------------------- */

int ty_kvpool_seq_layer_ranges(ty_kvpool_t *p, const ty_kvseq_t *s, uint32_t layer,
                               struct ty_kv_range *out, size_t cap)
{
    if (layer >= p->o.n_layers || s->n_released)
        return TY_EINVAL;
    if (cap < 2 * (size_t)s->n_pages)
        return TY_ERANGE;
    size_t bytes = ty_kvpool_page_bytes(p);
    for (uint32_t i = 0; i < s->n_pages; i++) {
        out[2 * i] = (struct ty_kv_range){ty_kvpool_k(p, layer, s->pages[i]), bytes};
        out[2 * i + 1] = (struct ty_kv_range){ty_kvpool_v(p, layer, s->pages[i]), bytes};
    }
    return (int)(2 * s->n_pages);
}

int ty_kvpool_seq_import_begin(ty_kvpool_t *p, ty_kvseq_t *s, const uint32_t *tokens, uint32_t n)
{
    if (s->n_tokens || s->n_pages || s->n_pending)
        return TY_EINVAL;
    int rc = ty_kvpool_seq_reserve(p, s, n);
    if (!rc)
        rc = push_tokens(s, tokens, n);
    if (!rc)
        s->n_pending = n;
    return rc;
}

int ty_kvpool_seq_import_done(ty_kvpool_t *p, ty_kvseq_t *s)
{
    s->n_tokens += s->n_pending;
    s->n_pending = 0;
    index_full_blocks(p, s);
    return 0;
}

#define KV_MAGIC 0x564b5954u /* "TYKV" */

/* version 1: f32 pages; version 2 adds the element type */
struct kv_header {
    uint32_t magic, version;
    uint32_t n_layers, n_kv_heads, head_dim, block_tokens;
    uint32_t n_tokens, n_pages;
    uint32_t dtype, reserved;
};
#define KV_HEADER_V1 (8 * sizeof(uint32_t))

int ty_kvpool_seq_export(ty_kvpool_t *p, const ty_kvseq_t *s, void **buf, size_t *len)
{
    struct kv_header h = {KV_MAGIC, 2, p->o.n_layers, p->o.n_kv_heads, p->o.head_dim,
                          p->o.block_tokens, s->n_tokens, s->n_pages, (uint32_t)p->o.dtype, 0};
    size_t pb = ty_kvpool_page_bytes(p);
    if (s->n_released)
        return TY_EINVAL;
    size_t total = sizeof(h) + (size_t)s->n_tokens * 4 + (size_t)p->o.n_layers * s->n_pages * 2 * pb;
    unsigned char *b = malloc(total);
    struct ty_kv_range *r = malloc((2 * (size_t)s->n_pages + 1) * sizeof(*r));
    if (!b || !r) {
        free(b);
        free(r);
        return TY_ENOMEM;
    }
    memcpy(b, &h, sizeof(h));
    memcpy(b + sizeof(h), s->tokens, (size_t)s->n_tokens * 4);
    unsigned char *w = b + sizeof(h) + (size_t)s->n_tokens * 4;
    int rc = 0;
    for (uint32_t l = 0; l < p->o.n_layers && !rc; l++) {
        int n = ty_kvpool_seq_layer_ranges(p, s, l, r, 2 * (size_t)s->n_pages + 1);
        for (int i = 0; i < n && !rc; i++, w += pb)
            rc = ty_kvpool_copy_out(p, w, r[i].ptr, pb);
    }
    free(r);
    if (rc) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = total;
    return 0;
}

int ty_kvpool_seq_import(ty_kvpool_t *p, ty_kvseq_t *s, const void *buf, size_t len)
{
    struct kv_header h = {0};
    size_t pb = ty_kvpool_page_bytes(p), hsize = sizeof(h);
    if (len < KV_HEADER_V1)
        return TY_EFORMAT;
    memcpy(&h, buf, KV_HEADER_V1);
    if (h.version == 1) {
        hsize = KV_HEADER_V1; /* f32 */
    } else if (h.version == 2 && len >= sizeof(h)) {
        memcpy(&h, buf, sizeof(h));
    } else {
        return TY_EFORMAT;
    }
    uint32_t B = p->o.block_tokens;
    if (h.magic != KV_MAGIC || h.dtype != (uint32_t)p->o.dtype || h.n_layers != p->o.n_layers ||
        h.n_kv_heads != p->o.n_kv_heads || h.head_dim != p->o.head_dim || h.block_tokens != B ||
        h.n_pages != (h.n_tokens + B - 1) / B ||
        len != hsize + (size_t)h.n_tokens * 4 + (size_t)h.n_layers * h.n_pages * 2 * pb)
        return TY_EFORMAT;
    const unsigned char *src = (const unsigned char *)buf + hsize;
    int rc = ty_kvpool_seq_import_begin(p, s, (const uint32_t *)src, h.n_tokens);
    if (rc)
        return rc;
    src += (size_t)h.n_tokens * 4;
    for (uint32_t l = 0; l < p->o.n_layers && !rc; l++)
        for (uint32_t i = 0; i < s->n_pages && !rc; i++, src += 2 * pb) {
            rc = ty_kvpool_copy_in(p, ty_kvpool_k(p, l, s->pages[i]), src, pb);
            if (!rc)
                rc = ty_kvpool_copy_in(p, ty_kvpool_v(p, l, s->pages[i]), src + pb, pb);
        }
    if (rc) {
        seq_clear(p, s);
        return rc;
    }
    return ty_kvpool_seq_import_done(p, s);
}
