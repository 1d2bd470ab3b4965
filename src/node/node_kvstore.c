/* The prefill node's use of the cluster KV pool (see kvstore.h). */
#include "tycho/node_kvstore.h"

#include "tycho/node.h"
#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/hash.h"
#include "tycho/log.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_LEN 24 /* "kv/" + 16 hex digits + NUL, rounded up */

/* The blocks waiting to be written: a ring of block-sized slots in registered memory. The
 * worker fills slots at `tail` (copies out of its pages, then the sequence can go), the
 * writer thread writes the oldest `pending` ones from `head` with put_batch and frees them. */
struct wring {
    uint8_t *mem;
    char (*keys)[KEY_LEN];
    uint32_t cap, head, pending;
    bool registered;
    /* writer-only arrays of one batch */
    const char **key_ptrs;
    const void **bufs;
    uint64_t *lens;
    int *status;
};

struct ty_node_kvstore {
    struct ty_node_kvstore_opts o;
    uint32_t B;
    size_t page_bytes, block_bytes;
    uint8_t *stage; /* reads: batch_blocks blocks */
    uint32_t batch_blocks;
    bool registered;
    _Atomic uint64_t down_until_ms; /* the pool failed: not asked before then */
    /* worker scratch, sized for the longest prompt seen */
    uint64_t *hashes;
    char (*keys)[KEY_LEN];
    const char **key_ptrs;
    int *status;
    void **bufs;
    uint64_t *lens, *got_lens; /* capacities / sizes of one batch's values */
    size_t cap;
    /* writes */
    pthread_t writer;
    bool writer_started, stop; /* stop: under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* work for the writer, or a batch done (flush) */
    bool writing;      /* under mu: the writer holds a batch */
    struct wring w;    /* indices under mu */
    _Atomic uint64_t lookups, hit_blocks, stored_blocks, errors, skipped, dropped;
};

static void *writer_main(void *arg);

/* Registered memory for zero-copy puts and gets; without the registration they go through
 * the client's bounce buffer, slower but the same bytes. */
static bool register_mem(struct ty_node_kvstore *s, void *mem, size_t len)
{
    int rc = ty_store_client_register(s->o.client, mem, len);
    if (rc)
        TY_LOG_WARN("kvstore",
                    "KV pool: staging buffer not registered (%s): copies go through "
                    "the client's bounce buffer",
                    ty_strerror(rc));
    return rc == 0;
}

int ty_node_kvstore_new(struct ty_node_kvstore **out, const struct ty_node_kvstore_opts *o)
{
    if (!out || !o || !o->client || !o->pool || !o->n_layers)
        return TY_EINVAL;
    struct ty_node_kvstore *s = calloc(1, sizeof(*s));
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
    /* a quarter of the staging for reads, the rest for the blocks waiting to be written */
    uint64_t nb = s->o.staging_bytes / 4 / s->block_bytes;
    s->batch_blocks = nb < 1 ? 1 : nb > 4096 ? 4096 : (uint32_t)nb;
    nb = s->o.staging_bytes / s->block_bytes - s->batch_blocks;
    struct wring *w = &s->w;
    w->cap = nb < 2 ? 2 : nb > 16384 ? 16384 : (uint32_t)nb;
    s->stage = malloc((size_t)s->batch_blocks * s->block_bytes);
    w->mem = malloc((size_t)w->cap * s->block_bytes);
    w->keys = calloc(w->cap, sizeof(*w->keys));
    w->key_ptrs = calloc(w->cap, sizeof(*w->key_ptrs));
    w->bufs = calloc(w->cap, sizeof(*w->bufs));
    w->lens = calloc(w->cap, sizeof(*w->lens));
    w->status = calloc(w->cap, sizeof(*w->status));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (!s->stage || !w->mem || !w->keys || !w->key_ptrs || !w->bufs || !w->lens || !w->status ||
        pthread_create(&s->writer, NULL, writer_main, s) != 0) {
        ty_node_kvstore_free(s);
        return TY_ENOMEM;
    }
    s->writer_started = true;
    s->registered = register_mem(s, s->stage, (size_t)s->batch_blocks * s->block_bytes);
    w->registered = register_mem(s, w->mem, (size_t)w->cap * s->block_bytes);
    *out = s;
    return 0;
}

void ty_node_kvstore_free(struct ty_node_kvstore *s)
{
    if (!s)
        return;
    if (s->writer_started) { /* what is queued is written first */
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->writer, NULL);
    }
    if (s->registered)
        ty_store_client_unregister(s->o.client, s->stage);
    if (s->w.registered)
        ty_store_client_unregister(s->o.client, s->w.mem);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->stage);
    free(s->w.mem);
    free(s->w.keys);
    free(s->w.key_ptrs);
    free(s->w.bufs);
    free(s->w.lens);
    free(s->w.status);
    free(s->hashes);
    free(s->keys);
    free(s->key_ptrs);
    free(s->status);
    free(s->bufs);
    free(s->lens);
    free(s->got_lens);
    free(s);
}

void ty_node_kvstore_flush(struct ty_node_kvstore *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->w.pending || s->writing)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

int ty_node_kvstore_client_new(const struct ty_node_pool_config *k, const char *listen_host,
                               const struct ty_auth *auth, ty_store_client_t **out)
{
    *out = NULL;
    if (!k->master)
        return 0;
    static const char *const transports[] = {"auto", "tcp", "local"};
    struct ty_store_client_opts co = {
        .master = k->master,
        .listen_host = listen_host,
        .auth = auth,
        .replicas = k->replicas,
        .timeout_ms = (uint32_t)(k->timeout_ns / 1000000),
        .transport = transports[(unsigned)k->transport < 3 ? k->transport : 0]};
    return ty_store_client_new(out, &co);
}

void ty_node_kvstore_stats(const struct ty_node_kvstore *s, struct ty_node_kvstore_stats *out)
{
    out->lookups = atomic_load(&s->lookups);
    out->hit_blocks = atomic_load(&s->hit_blocks);
    out->stored_blocks = atomic_load(&s->stored_blocks);
    out->errors = atomic_load(&s->errors);
    out->skipped = atomic_load(&s->skipped);
    out->dropped = atomic_load(&s->dropped);
}

/* Scratch for nb blocks; false when memory is short (the pool is then skipped). */
static bool scratch(struct ty_node_kvstore *s, size_t nb)
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
static void name_blocks(struct ty_node_kvstore *s, const uint32_t *tokens, uint32_t n, size_t nb)
{
    ty_hash_prefix_blocks(tokens, n, s->B, s->o.hash_seed, s->hashes, nb);
    for (size_t i = 0; i < nb; i++) {
        snprintf(s->keys[i], KEY_LEN, "kv/%016" PRIx64, s->hashes[i]);
        s->key_ptrs[i] = s->keys[i];
    }
}

static bool pool_up(struct ty_node_kvstore *s)
{
    uint64_t until = atomic_load(&s->down_until_ms);
    if (!until || ty_clock_ms() >= until)
        return true;
    atomic_fetch_add(&s->skipped, 1);
    return false;
}

/* An operation failed: count it, and stop asking the pool for a while when the failure says
 * the pool (not this block) is the problem. */
static void pool_failed(struct ty_node_kvstore *s, const char *what, int rc)
{
    atomic_fetch_add(&s->errors, 1);
    if (rc == TY_ENOTFOUND || rc == TY_EEXIST || rc == TY_ENOCAPACITY || rc == TY_ENOSPC)
        return;
    if (!atomic_exchange(&s->down_until_ms, ty_clock_ms() + s->o.retry_ms))
        TY_LOG_WARN("kvstore", "KV pool %s failed (%s): not used for %u ms", what, ty_strerror(rc),
                    s->o.retry_ms);
}

static void pool_ok(struct ty_node_kvstore *s)
{
    if (atomic_load(&s->down_until_ms) && atomic_exchange(&s->down_until_ms, 0))
        TY_LOG_INFO("kvstore", "KV pool reachable again");
}

/* Copy block `blk` of seq between the pool's page memory and `at` (one block's bytes). */
static int block_copy(struct ty_node_kvstore *s, const ty_kvseq_t *seq, uint32_t blk, uint8_t *at,
                      bool to_pool)
{
    ty_kvpool_t *pool = s->o.pool;
    uint32_t page = ty_kvseq_pages(seq)[blk];
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

uint32_t ty_node_kvstore_fetch(struct ty_node_kvstore *s, ty_kvseq_t *seq, const uint32_t *tokens,
                               uint32_t n, uint32_t max_blocks)
{
    uint32_t B = s->B, have = ty_kvseq_n_tokens(seq) / B;
    uint32_t nb = n ? (n - 1) / B : 0; /* one token is always left to compute */
    if (nb > max_blocks)
        nb = max_blocks;
    if (have >= nb || !pool_up(s) || !scratch(s, nb))
        return 0;
    atomic_fetch_add(&s->lookups, 1);
    name_blocks(s, tokens, n, nb);
    int rc =
        ty_store_client_exists_batch(s->o.client, nb - have, s->key_ptrs + have, s->status + have);
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
        rc = ty_store_client_get_batch(s->o.client, m, s->key_ptrs + have + got, s->bufs, s->lens,
                                       s->got_lens, s->status);
        uint32_t ok = 0;
        while (ok < m && s->status[ok] == 0 && s->got_lens[ok] == s->block_bytes)
            ok++;
        rc = ok < m ? s->status[ok] : 0;
        for (uint32_t i = 0; i < ok; i++) {
            if ((rc = block_copy(s, seq, have + got + i, s->stage + (size_t)i * s->block_bytes,
                                 true))) {
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

/* The writer thread: put the oldest waiting blocks, a contiguous run of the ring at a time. */
static void *writer_main(void *arg)
{
    struct ty_node_kvstore *s = arg;
    struct wring *w = &s->w;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!w->pending && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!w->pending)
            break; /* stopping, nothing left */
        uint32_t head = w->head, m = w->pending;
        if (head + m > w->cap)
            m = w->cap - head;
        if (m > s->batch_blocks)
            m = s->batch_blocks;
        s->writing = true;
        pthread_mutex_unlock(&s->mu);
        int failed = 0;
        uint32_t stored = 0;
        if (pool_up(s)) {
            for (uint32_t i = 0; i < m; i++) {
                w->key_ptrs[i] = w->keys[head + i];
                w->bufs[i] = w->mem + (size_t)(head + i) * s->block_bytes;
                w->lens[i] = s->block_bytes;
            }
            ty_store_client_put_batch(s->o.client, m, w->key_ptrs, w->bufs, w->lens, w->status);
            /* a block another node stored first is as good as ours; a full pool refuses only
             * this batch */
            for (uint32_t i = 0; i < m; i++) {
                stored += w->status[i] == 0;
                if (w->status[i] && w->status[i] != TY_EEXIST && !failed)
                    failed = w->status[i];
            }
            if (failed)
                pool_failed(s, "write", failed);
            else
                pool_ok(s);
        } else {
            atomic_fetch_add(&s->dropped, m);
        }
        atomic_fetch_add(&s->stored_blocks, stored);
        pthread_mutex_lock(&s->mu);
        w->head = (head + m) % w->cap;
        w->pending -= m;
        s->writing = false;
        pthread_cond_broadcast(&s->cv); /* room for the worker, progress for a flush */
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void ty_node_kvstore_store(struct ty_node_kvstore *s, const ty_kvseq_t *seq, const uint32_t *tokens,
                           uint32_t n, uint32_t known)
{
    uint32_t B = s->B, nb = n / B, from = known / B;
    if (from >= nb || ty_kvseq_n_tokens(seq) < nb * B || !pool_up(s) || !scratch(s, nb))
        return;
    name_blocks(s, tokens, n, nb);
    struct wring *w = &s->w;
    pthread_mutex_lock(&s->mu);
    uint32_t room = w->cap - w->pending, tail = (w->head + w->pending) % w->cap;
    pthread_mutex_unlock(&s->mu);
    /* slots [tail, tail + room) are the worker's until it publishes them below */
    uint32_t k = 0;
    for (uint32_t b = from; b < nb && k < room; b++, k++) {
        uint32_t slot = (tail + k) % w->cap;
        if (block_copy(s, seq, b, w->mem + (size_t)slot * s->block_bytes, false)) {
            pool_failed(s, "copy", TY_EIO);
            break;
        }
        memcpy(w->keys[slot], s->keys[b], KEY_LEN);
    }
    if (nb - from > k) /* the writer is behind: these are not written */
        atomic_fetch_add(&s->dropped, nb - from - k);
    if (!k)
        return;
    pthread_mutex_lock(&s->mu);
    w->pending += k;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}
