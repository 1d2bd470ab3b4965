/* The prefill node's use of the cluster KV pool (see kvstore.h). */
#include "kvstore.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/hash.h"
#include "tycho/log.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_LEN 24 /* "kv/" + 16 hex digits + NUL, rounded up */

struct ty_prefill_kvstore {
    struct ty_prefill_kvstore_opts o;
    uint32_t B;
    size_t page_bytes, block_bytes;
    uint8_t *stage; /* batch_blocks blocks */
    uint32_t batch_blocks;
    bool registered;
    uint64_t down_until_ms; /* the pool failed: not asked before then */
    /* worker scratch, sized for the longest prompt seen */
    uint64_t *hashes;
    char (*keys)[KEY_LEN];
    const char **key_ptrs;
    int *status;
    void **bufs;
    uint64_t *lens, *got_lens; /* capacities / sizes of one batch's values */
    size_t cap;
    _Atomic uint64_t lookups, hit_blocks, stored_blocks, errors, skipped;
};

int ty_prefill_kvstore_new(struct ty_prefill_kvstore **out,
                           const struct ty_prefill_kvstore_opts *o)
{
    if (!out || !o || !o->client || !o->pool || !o->n_layers)
        return TY_EINVAL;
    struct ty_prefill_kvstore *s = calloc(1, sizeof(*s));
    if (!s)
        return TY_ENOMEM;
    s->o = *o;
    if (!s->o.staging_bytes)
        s->o.staging_bytes = 64ull << 20;
    if (!s->o.retry_ms)
        s->o.retry_ms = 5000;
    s->B = ty_kvpool_block_tokens(o->pool);
    s->page_bytes = ty_kvpool_page_bytes(o->pool);
    s->block_bytes = 2 * (size_t)o->n_layers * s->page_bytes;
    uint64_t nb = s->o.staging_bytes / s->block_bytes;
    s->batch_blocks = nb < 1 ? 1 : nb > 4096 ? 4096 : (uint32_t)nb;
    s->stage = malloc((size_t)s->batch_blocks * s->block_bytes);
    if (!s->stage) {
        free(s);
        return TY_ENOMEM;
    }
    /* zero-copy puts and gets; without the registration they go through the client's bounce
     * buffer, slower but the same bytes */
    int rc = ty_store_client_register(o->client, s->stage, (size_t)s->batch_blocks * s->block_bytes);
    s->registered = rc == 0;
    if (rc)
        TY_LOG_WARN("prefill", "KV pool: staging buffer not registered (%s): copies go through "
                    "the client's bounce buffer", ty_strerror(rc));
    *out = s;
    return 0;
}

void ty_prefill_kvstore_free(struct ty_prefill_kvstore *s)
{
    if (!s)
        return;
    if (s->registered)
        ty_store_client_unregister(s->o.client, s->stage);
    free(s->stage);
    free(s->hashes);
    free(s->keys);
    free(s->key_ptrs);
    free(s->status);
    free(s->bufs);
    free(s->lens);
    free(s->got_lens);
    free(s);
}

void ty_prefill_kvstore_stats(const struct ty_prefill_kvstore *s,
                              struct ty_prefill_kvstore_stats *out)
{
    out->lookups = atomic_load(&s->lookups);
    out->hit_blocks = atomic_load(&s->hit_blocks);
    out->stored_blocks = atomic_load(&s->stored_blocks);
    out->errors = atomic_load(&s->errors);
    out->skipped = atomic_load(&s->skipped);
}

/* Scratch for nb blocks; false when memory is short (the pool is then skipped). */
static bool scratch(struct ty_prefill_kvstore *s, size_t nb)
{
    if (nb <= s->cap)
        return true;
    size_t cap = nb < 64 ? 64 : nb;
    uint64_t *h = realloc(s->hashes, cap * sizeof(*h));
    if (h)
        s->hashes = h;
    char(*k)[KEY_LEN] = realloc(s->keys, cap * sizeof(*k));
    if (k)
        s->keys = k;
    const char **kp = realloc(s->key_ptrs, cap * sizeof(*kp));
    if (kp)
        s->key_ptrs = kp;
    int *st = realloc(s->status, cap * sizeof(*st));
    if (st)
        s->status = st;
    void **b = realloc(s->bufs, cap * sizeof(*b));
    if (b)
        s->bufs = b;
    uint64_t *l = realloc(s->lens, cap * sizeof(*l));
    if (l)
        s->lens = l;
    uint64_t *g = realloc(s->got_lens, cap * sizeof(*g));
    if (g)
        s->got_lens = g;
    if (!h || !k || !kp || !st || !b || !l || !g)
        return false;
    s->cap = cap;
    return true;
}

/* Hash and name the first nb full blocks of tokens. */
static void name_blocks(struct ty_prefill_kvstore *s, const uint32_t *tokens, uint32_t n,
                        size_t nb)
{
    ty_hash_prefix_blocks(tokens, n, s->B, s->o.hash_seed, s->hashes, nb);
    for (size_t i = 0; i < nb; i++) {
        snprintf(s->keys[i], KEY_LEN, "kv/%016" PRIx64, s->hashes[i]);
        s->key_ptrs[i] = s->keys[i];
    }
}

static bool pool_up(struct ty_prefill_kvstore *s)
{
    if (!s->down_until_ms || ty_clock_ms() >= s->down_until_ms)
        return true;
    atomic_fetch_add(&s->skipped, 1);
    return false;
}

/* An operation failed: count it, and stop asking the pool for a while when the failure says
 * the pool (not this block) is the problem. */
static void pool_failed(struct ty_prefill_kvstore *s, const char *what, int rc)
{
    atomic_fetch_add(&s->errors, 1);
    if (rc == TY_ENOTFOUND || rc == TY_EEXIST || rc == TY_ENOCAPACITY || rc == TY_ENOSPC)
        return;
    if (!s->down_until_ms)
        TY_LOG_WARN("prefill", "KV pool %s failed (%s): not used for %u ms", what,
                    ty_strerror(rc), s->o.retry_ms);
    s->down_until_ms = ty_clock_ms() + s->o.retry_ms;
}

static void pool_ok(struct ty_prefill_kvstore *s)
{
    if (s->down_until_ms) {
        TY_LOG_INFO("prefill", "KV pool reachable again");
        s->down_until_ms = 0;
    }
}

/* Copy block `blk` of seq between the pool's page memory and staging slot `slot`. */
static int block_copy(struct ty_prefill_kvstore *s, const ty_kvseq_t *seq, uint32_t blk,
                      uint32_t slot, bool to_pool)
{
    ty_kvpool_t *pool = s->o.pool;
    uint32_t page = ty_kvseq_pages(seq)[blk];
    uint8_t *at = s->stage + (size_t)slot * s->block_bytes;
    for (uint32_t l = 0; l < s->o.n_layers; l++) {
        void *k = ty_kvpool_k(pool, l, page), *v = ty_kvpool_v(pool, l, page);
        int rc = to_pool ? ty_kvpool_copy_in(pool, k, at, s->page_bytes)
                         : ty_kvpool_copy_out(pool, at, k, s->page_bytes);
        at += s->page_bytes;
        if (!rc)
            rc = to_pool ? ty_kvpool_copy_in(pool, v, at, s->page_bytes)
                         : ty_kvpool_copy_out(pool, at, v, s->page_bytes);
        at += s->page_bytes;
        if (rc)
            return rc;
    }
    return 0;
}

uint32_t ty_prefill_kvstore_fetch(struct ty_prefill_kvstore *s, ty_kvseq_t *seq,
                                  const uint32_t *tokens, uint32_t n)
{
    uint32_t B = s->B, have = ty_kvseq_n_tokens(seq) / B;
    uint32_t nb = n ? (n - 1) / B : 0; /* one token is always left to compute */
    if (have >= nb || !pool_up(s) || !scratch(s, nb))
        return 0;
    atomic_fetch_add(&s->lookups, 1);
    name_blocks(s, tokens, n, nb);
    int rc = ty_store_client_exists_batch(s->o.client, nb - have, s->key_ptrs + have,
                                          s->status + have);
    if (rc && rc != TY_ENOTFOUND) {
        pool_failed(s, "lookup", rc);
        return 0;
    }
    pool_ok(s);
    uint32_t run = 0;
    while (have + run < nb && s->status[have + run] == 0)
        run++;
    if (!run)
        return 0;
    rc = ty_kvpool_seq_reserve(s->o.pool, seq, run * B);
    if (rc) { /* the page cache is full: compute instead */
        atomic_fetch_add(&s->errors, 1);
        return 0;
    }
    uint32_t got = 0;
    while (got < run) {
        uint32_t m = run - got < s->batch_blocks ? run - got : s->batch_blocks;
        for (uint32_t i = 0; i < m; i++) {
            s->bufs[i] = s->stage + (size_t)i * s->block_bytes;
            s->lens[i] = s->block_bytes;
        }
        rc = ty_store_client_get_batch(s->o.client, m, s->key_ptrs + have + got, s->bufs,
                                       s->lens, s->got_lens, s->status);
        uint32_t ok = 0;
        while (ok < m && s->status[ok] == 0 && s->got_lens[ok] == s->block_bytes)
            ok++;
        rc = ok < m ? s->status[ok] : 0;
        for (uint32_t i = 0; i < ok; i++) {
            if ((rc = block_copy(s, seq, have + got + i, i, true))) {
                ok = i;
                break;
            }
        }
        if (ok < m) /* evicted since the lookup, a value of another size, or the pool */
            pool_failed(s, "read", rc ? rc : TY_ENOTFOUND);
        /* commit what arrived: the blocks become this node's (indexed, shared, reported) */
        if (ok && ty_kvpool_seq_commit(s->o.pool, seq, tokens + (have + got) * B, ok * B))
            break;
        got += ok;
        if (ok < m)
            break;
    }
    atomic_fetch_add(&s->hit_blocks, got);
    return got * B;
}

void ty_prefill_kvstore_store(struct ty_prefill_kvstore *s, const ty_kvseq_t *seq,
                              const uint32_t *tokens, uint32_t n, uint32_t known)
{
    uint32_t B = s->B, nb = n / B, from = known / B;
    if (from >= nb || ty_kvseq_n_tokens(seq) < nb * B || !pool_up(s) || !scratch(s, nb))
        return;
    name_blocks(s, tokens, n, nb);
    uint32_t done = from, stored = 0;
    while (done < nb) {
        uint32_t m = nb - done < s->batch_blocks ? nb - done : s->batch_blocks;
        for (uint32_t i = 0; i < m; i++) {
            int rc = block_copy(s, seq, done + i, i, false);
            if (rc) {
                pool_failed(s, "copy", rc);
                return;
            }
            s->bufs[i] = s->stage + (size_t)i * s->block_bytes;
            s->lens[i] = s->block_bytes;
        }
        ty_store_client_put_batch(s->o.client, m, s->key_ptrs + done,
                                  (const void *const *)s->bufs, s->lens, s->status);
        /* a block another node stored first is as good as ours; a full pool refuses only
         * this batch */
        int failed = 0;
        for (uint32_t i = 0; i < m; i++) {
            stored += s->status[i] == 0;
            if (s->status[i] && s->status[i] != TY_EEXIST && !failed)
                failed = s->status[i];
        }
        if (failed) {
            pool_failed(s, "write", failed);
            if (failed != TY_ENOCAPACITY)
                break;
        } else {
            pool_ok(s);
        }
        done += m;
    }
    atomic_fetch_add(&s->stored_blocks, stored);
}
