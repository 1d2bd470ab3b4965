/* KV page pool: per layer, K and V arrays laid out [page][kv_head][token][head_dim] (f32, or
 * IEEE f16 / bfloat16 with opts.dtype = TY_KV_F16 / TY_KV_BF16: half the memory and half the
 * bytes moved per page),
 * pages of B = block_tokens tokens (DESIGN.md §4). Page memory is host memory, or memory a
 * backend supplies through struct ty_kvpool_storage (device memory of a GPU backend); the
 * bookkeeping is the same either way. A sequence owns a block table (page ids) and
 * the tokens whose KV it holds; pages are reference-counted so sequences with the same full
 * prefix blocks share them (found by the chained prefix hash of ty_hash_prefix_step()).
 *
 * Threads: a pool and its sequences belong to one thread (the engine's); the forward pass
 * reads and writes page memory from its worker threads only inside one forward call.
 * Ownership: sequences are created and freed through the pool; the pool must outlive them.
 */
#ifndef TYCHO_KVPOOL_H
#define TYCHO_KVPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ty_kvpool ty_kvpool_t;
typedef struct ty_kvseq ty_kvseq_t;

/* Page memory supplied by a backend (e.g. device memory) or by the caller (host shared memory
 * that the transfer engine hands to peers). alloc returns zeroed memory of `bytes` (NULL on
 * failure); copy moves `bytes` between host memory and that memory (to_pool: host src -> pool
 * dst, else pool src -> host dst) and returns 0 or TY_E*, complete when it returns. With `host`
 * the memory is host memory the process may dereference: copy is unused (may be NULL) and the
 * pool counts as a host pool (ty_kvpool_is_host). The hooks are called from the pool's thread;
 * ctx must outlive the pool. */
struct ty_kvpool_storage {
    void *ctx;
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *ptr);
    int (*copy)(void *ctx, void *dst, const void *src, size_t bytes, bool to_pool);
    const char *name; /* for messages, e.g. "cuda:0" */
    bool host;
};

/* A full block's prefix hash entered (stored) or left (!stored) the pool's prefix index: the
 * blocks ty_kvpool_seq_match_prefix() can find are exactly those stored and not removed since.
 *   - stored: a committed or imported block became full and no other page holds its hash (a
 *     block equal to an indexed one is not indexed and reports nothing);
 *   - removed: the indexed page was taken for other tokens (a cached block evicted), the only
 *     way an entry leaves the index.
 * A cached block a sequence takes back, or an entry that only moves (index compaction), reports
 * nothing; so does everything with no_prefix_sharing, and ty_kvpool_free(). Each hash therefore
 * alternates stored, removed, stored... Hashes are ty_hash_prefix_step() chains seeded with
 * opts.hash_seed. Called on the pool's thread, from inside ty_kvpool_seq_reserve (eviction),
 * _seq_commit, _seq_import_begin, _seq_import_done and _seq_import; it must not call the pool. */
typedef void (*ty_kvpool_block_cb)(void *arg, uint64_t hash, bool stored);

/* Element type of page memory. */
enum ty_kv_dtype {
    TY_KV_F32 = 0,
    TY_KV_F16 = 1,  /* IEEE half, rounded to nearest even when stored */
    TY_KV_BF16 = 2, /* bfloat16 (f32's top 16 bits), rounded to nearest even when stored */
};
/* "f32" / "f16" / "bf16" (the name in configs, node registrations and ty_hash_prefix_seed()). */
const char *ty_kv_dtype_name(enum ty_kv_dtype t);
/* Parse "f32", "f16" or "bf16"; returns 0 or TY_EINVAL. */
int ty_kv_dtype_parse(const char *s, enum ty_kv_dtype *out);
/* Bytes of one element. */
size_t ty_kv_dtype_size(enum ty_kv_dtype t);

struct ty_kvpool_opts {
    uint32_t n_layers, n_kv_heads, head_dim;
    uint32_t block_tokens; /* B; default 64 when 0 */
    uint32_t n_pages;      /* pages per layer */
    enum ty_kv_dtype dtype; /* element type of page memory (TY_KV_F32 = 0) */
    uint64_t hash_seed;    /* prefix hash seed (ty_hash_prefix_seed()) */
    bool no_prefix_sharing;
    const struct ty_kvpool_storage *storage; /* NULL: host memory; copied */
    ty_kvpool_block_cb block_cb;             /* optional: prefix index changes */
    void *block_arg;                         /* must outlive the pool */
};

/* Returns 0, TY_EINVAL (bad geometry) or TY_ENOMEM (page memory). */
int ty_kvpool_new(ty_kvpool_t **out, const struct ty_kvpool_opts *opts);
void ty_kvpool_free(ty_kvpool_t *p);

uint32_t ty_kvpool_block_tokens(const ty_kvpool_t *p);
/* The seed of the pool's prefix hashes (opts.hash_seed): ty_hash_prefix_blocks() with it names
 * the full blocks of a prompt as this pool's index does. */
uint64_t ty_kvpool_hash_seed(const ty_kvpool_t *p);
uint32_t ty_kvpool_pages_total(const ty_kvpool_t *p);
/* Pages held by sequences. Full blocks no sequence holds any more stay cached (indexed, their
 * KV intact) until their pages are needed, so a later prompt with that prefix finds them:
 * ty_kvpool_pages_cached() of them, counted as free capacity, not as used. */
uint32_t ty_kvpool_pages_used(const ty_kvpool_t *p);
uint32_t ty_kvpool_pages_cached(const ty_kvpool_t *p);
/* Pages a reservation can still take: the free ones and the cached ones (total - used). */
uint32_t ty_kvpool_pages_free(const ty_kvpool_t *p);
/* Bytes of one page's K (or V) chunk for one layer: n_kv_heads * B * head_dim * element size. */
size_t ty_kvpool_page_bytes(const ty_kvpool_t *p);
enum ty_kv_dtype ty_kvpool_dtype(const ty_kvpool_t *p);
/* True when page memory is host memory (no storage hooks): only then may the host
 * dereference what ty_kvpool_k/v and the layer ranges return. */
bool ty_kvpool_is_host(const ty_kvpool_t *p);
/* Copy `n` bytes between host memory and page memory of this pool (a memcpy for host pools,
 * the storage's copy hook otherwise). Returns 0 or the hook's TY_E*. */
int ty_kvpool_copy_in(ty_kvpool_t *p, void *pool_dst, const void *host_src, size_t n);
int ty_kvpool_copy_out(ty_kvpool_t *p, void *host_dst, const void *pool_src, size_t n);
/* K or V chunk of `page` in `layer`: (n_kv_heads, B, head_dim) elements of the pool's dtype,
 * in page memory (see ty_kvpool_is_host()). Host or backend memory alike, each layer's K (and
 * V) is one array of pages: ty_kvpool_k(p, l, i) = ty_kvpool_k(p, l, 0) + i * page_bytes, which
 * lets a decode node describe where a sequence's KV goes as page ids, one base per layer and a
 * stride (tycho.proto KvDestination). */
void *ty_kvpool_k(ty_kvpool_t *p, uint32_t layer, uint32_t page);
void *ty_kvpool_v(ty_kvpool_t *p, uint32_t layer, uint32_t page);

/* Whether a full block with this chained prefix hash is in the prefix index (held by a
 * sequence or cached): what ty_kvpool_seq_match_prefix() would find. */
bool ty_kvpool_holds(const ty_kvpool_t *p, uint64_t hash);

/* A new empty sequence. */
int ty_kvpool_seq_new(ty_kvpool_t *p, ty_kvseq_t **out);
/* Release the sequence's pages: unshared full blocks stay cached (see ty_kvpool_pages_used),
 * the rest return to the free list. NULL is a no-op. */
void ty_kvpool_seq_free(ty_kvpool_t *p, ty_kvseq_t *s);
/* Keep s out of the page cache: its blocks are never indexed (nor found by
 * ty_kvpool_seq_match_prefix on s), and its pages are freed, not cached, when it is freed.
 * For KV that is not the whole model's (a pipeline stage holds some layers only). */
void ty_kvpool_seq_set_private(ty_kvseq_t *s);
/* On an empty sequence: attach already-computed full blocks that are a prefix of `tokens`
 * (at most (n-1)/B blocks, so at least one token is left to compute). Returns the number of
 * tokens whose KV is now present (a multiple of B), or a negative TY_E*. */
int ty_kvpool_seq_match_prefix(ty_kvpool_t *p, ty_kvseq_t *s, const uint32_t *tokens, size_t n);
/* Make room for `n_new` more tokens (allocating pages). TY_ENOCAPACITY when the pool is full. */
int ty_kvpool_seq_reserve(ty_kvpool_t *p, ty_kvseq_t *s, uint32_t n_new);
/* Record that KV for the next `n` tokens has been written; full blocks become shareable. */
int ty_kvpool_seq_commit(ty_kvpool_t *p, ty_kvseq_t *s, const uint32_t *tokens, uint32_t n);

/* Sliding-window attention: release the pages of `s` that hold only positions before `pos`
 * (whole committed blocks; no layer reads them any more). Their block table entries become
 * TY_KVPOOL_NO_PAGE, so positions keep their page index. A released full block that no one
 * else holds stays cached like any other (its KV is the same for every sequence with that
 * prefix, so a later prompt may still match it; a match stops at the first block not indexed).
 * A sequence with released pages can no longer be exported (layer ranges, seq_export:
 * TY_EINVAL). Returns the pages released by this call. */
#define TY_KVPOOL_NO_PAGE UINT32_MAX
uint32_t ty_kvpool_seq_release_before(ty_kvpool_t *p, ty_kvseq_t *s, uint32_t pos);
/* Leading block table entries released by ty_kvpool_seq_release_before(). */
uint32_t ty_kvseq_n_released(const ty_kvseq_t *s);

uint32_t ty_kvseq_n_tokens(const ty_kvseq_t *s);
const uint32_t *ty_kvseq_tokens(const ty_kvseq_t *s);
uint32_t ty_kvseq_n_pages(const ty_kvseq_t *s);
const uint32_t *ty_kvseq_pages(const ty_kvseq_t *s);

/* ---- export / import ---------------------------------------------------------------------
 * The KV of one sequence as per-layer byte ranges: for layer l, the K chunk then the V chunk
 * of every page of the block table, in order (2 * n_pages ranges of page_bytes each). These
 * are what a prefill node sends to a decode node layer by layer; the destination obtains its
 * own ranges for a sequence reserved with the same token count and copies range i to range i.
 * The ranges are in page memory: device pointers for a device pool (ty_kvpool_is_host()).
 */
struct ty_kv_range {
    void *ptr;
    size_t len;
};
/* Fill `out` (capacity `cap`, needs 2 * n_pages) for `layer`; returns the count, TY_ERANGE, or
 * TY_EINVAL (bad layer, or pages released). */
int ty_kvpool_seq_layer_ranges(ty_kvpool_t *p, const ty_kvseq_t *s, uint32_t layer,
                               struct ty_kv_range *out, size_t cap);
/* Prepare an empty sequence to receive `n` tokens of KV (pages reserved, tokens recorded,
 * nothing shared): then copy into its layer ranges and call ty_kvpool_seq_import_done(). */
int ty_kvpool_seq_import_begin(ty_kvpool_t *p, ty_kvseq_t *s, const uint32_t *tokens, uint32_t n);
int ty_kvpool_seq_import_done(ty_kvpool_t *p, ty_kvseq_t *s);

/* Flat serialisation of a sequence's KV (header with the geometry and dtype, tokens, then per
 * layer the ranges above),
 * e.g. for files or a single transfer; always host memory, the same bytes for host and device
 * pools (so KV moves between backends). export: malloc'ed buffer the caller frees. import:
 * validates the header against this pool's geometry (TY_EFORMAT with a reason); on a copy
 * error the sequence is left empty. */
int ty_kvpool_seq_export(ty_kvpool_t *p, const ty_kvseq_t *s, void **buf, size_t *len);
int ty_kvpool_seq_import(ty_kvpool_t *p, ty_kvseq_t *s, const void *buf, size_t len);

#endif
