/* Engine: chunked batched forward over the pool, and the generation loop. */
#include "tycho/engine.h"

#include "backend-impl.h"
#include "model-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/hash.h"
#include "tycho/log.h"
#include "tycho/tokenizer.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ty_engine {
    const ty_model_t *m;
    ty_backend_t *be;
    ty_kvpool_t *pool;
    uint32_t max_ctx, max_batch;
    float *tmp_logits; /* (max_batch, n_vocab) */
    _Atomic uint64_t busy_since_ns; /* the forward call running began then; 0: none runs */
    uint64_t n_forward;             /* forward calls begun (the engine's thread) */
    uint64_t hang_at;               /* test hook TYCHO_TEST_HANG_FORWARD: this call never ends */
};

/* Backend first: a device backend supplies the pool's page memory. */
static int make_backend_and_pool(ty_engine_t *e, const struct ty_engine_opts *o)
{
    const struct ty_model_config *c = ty_model_config(e->m);
    struct ty_backend_cpu_opts bo = {.n_threads = o->n_threads};
    struct ty_backend_cuda_opts go = {.device = o->cuda_device, .weights = o->cuda_weights,
                                      .no_graphs = o->cuda_no_graphs};
    struct ty_kvpool_storage st;
    int rc = ty_backend_new_by_name(&e->be, o->backend, &bo, &go);
    if (rc)
        return rc;
    int dev = ty_backend_kv_storage(e->be, &st);
    if (dev < 0)
        return dev;
    enum ty_kv_dtype dt = TY_KV_F32;
    /* auto: f16 pages for a 16-bit or quantized model (llama.cpp's default cache type; on
     * CUDA they also take the tensor-core prefill attention), f32 for an F32 model */
    if (!o->kv_dtype || !strcmp(o->kv_dtype, "auto"))
        dt = c->weight_type != TY_GGML_F32 ? TY_KV_F16 : TY_KV_F32;
    else if (ty_kv_dtype_parse(o->kv_dtype, &dt))
        return TY_EINVAL;
    if (!(e->be->iface->kv_dtypes & 1u << dt)) {
        TY_LOG_ERROR("engine", "kv_cache_dtype %s is not supported by the %s backend",
                     ty_kv_dtype_name(dt), ty_backend_name(e->be));
        return TY_EINVAL;
    }
    uint32_t n_pages = o->kv_pages;
    if (!n_pages) { /* a memory budget: K and V of every layer per page */
        uint64_t page = 2ull * c->n_layers * c->n_kv_heads * o->kv_block_tokens * c->head_dim *
                        ty_kv_dtype_size(dt);
        uint64_t n = o->kv_bytes / page;
        if (n < 1 || n > (1u << 28)) {
            TY_LOG_ERROR("engine", "kv memory %llu bytes holds %llu pages of %llu bytes "
                         "(1 to 2^28 needed)", (unsigned long long)o->kv_bytes,
                         (unsigned long long)n, (unsigned long long)page);
            return TY_EINVAL;
        }
        n_pages = (uint32_t)n;
    }
    struct ty_kvpool_opts po = {
        .n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
        .block_tokens = o->kv_block_tokens, .n_pages = n_pages, .dtype = dt,
        .hash_seed = ty_hash_prefix_seed(ty_model_desc(e->m), ty_kv_dtype_name(dt),
                                         o->kv_block_tokens, NULL),
        .no_prefix_sharing = o->no_prefix_sharing, .storage = dev ? &st : o->kv_host_storage,
        .block_cb = o->kv_block_cb, .block_arg = o->kv_block_arg};
    if ((rc = ty_kvpool_new(&e->pool, &po)))
        return rc;
    /* a sequence must fit the pool alone: pages are reserved as it grows, and one that cannot
     * grow with nothing else to preempt would fail mid-answer */
    uint64_t hold = (uint64_t)n_pages * o->kv_block_tokens;
    if (hold < e->max_ctx) {
        TY_LOG_WARN("engine", "the KV cache holds %llu tokens: context lowered from %u to %llu "
                    "(raise kv_pages or kv_cache_memory to keep it)", (unsigned long long)hold,
                    e->max_ctx, (unsigned long long)hold);
        e->max_ctx = (uint32_t)hold;
    }
    TY_LOG_INFO("engine", "%s backend, KV cache %s: %u pages of %u tokens (%u tokens, %.1f MiB)",
                ty_backend_name(e->be), ty_kv_dtype_name(dt), n_pages, o->kv_block_tokens,
                n_pages * o->kv_block_tokens,
                2.0 * c->n_layers * (double)ty_kvpool_page_bytes(e->pool) * n_pages / 1048576.0);
    return 0;
}

const char *const ty_engine_kv_dtype_names[] = {"auto", "f32", "f16", "bf16", NULL};
const char *const ty_engine_backend_names[] = {"cpu", "cuda", NULL};
const char *const ty_engine_cuda_weights_names[] = {"auto", "f32", "f16", "bf16", NULL};

uint32_t ty_engine_default_ctx(uint32_t model_ctx)
{
    return model_ctx < TY_ENGINE_MAX_CTX ? model_ctx : TY_ENGINE_MAX_CTX;
}

/* The KV pool when neither kv_pages nor kv_bytes is set: max_seqs sequences of up to 4096
 * tokens (every sequence's whole context for a model of 4k or less), and never less than one
 * whole max_ctx sequence. A 128k model thus gets one 128k sequence's worth, not max_seqs of
 * them; sequences share that budget page by page and the batcher preempts when it runs out
 * (vLLM's and SGLang's KV budget, which also must hold one max_model_len sequence). */
static uint64_t default_kv_tokens(const struct ty_engine_opts *o)
{
    uint64_t per = o->max_ctx < 4096 ? o->max_ctx : 4096;
    uint64_t t = (uint64_t)o->max_seqs * ((per + o->kv_block_tokens - 1) / o->kv_block_tokens) *
                 o->kv_block_tokens;
    return t > o->max_ctx ? t : ((uint64_t)o->max_ctx + o->kv_block_tokens - 1) /
                                    o->kv_block_tokens * o->kv_block_tokens;
}

int ty_engine_new(ty_engine_t **out, const ty_model_t *m, const struct ty_engine_opts *opts)
{
    const struct ty_model_config *c = ty_model_config(m);
    struct ty_engine_opts o = opts ? *opts : (struct ty_engine_opts){0};
    int rc = TY_ENOMEM;
    *out = NULL;
    o.kv_block_tokens = o.kv_block_tokens ? o.kv_block_tokens : 64;
    o.max_seqs = o.max_seqs ? o.max_seqs : 8;
    o.max_ctx = o.max_ctx ? o.max_ctx : ty_engine_default_ctx(c->ctx_len);
    o.max_batch_tokens = o.max_batch_tokens ? o.max_batch_tokens : 512;
    if (o.max_batch_tokens > 65536 || o.max_ctx > TY_ENGINE_MAX_CTX)
        return TY_EINVAL;
    if (!o.kv_pages && !o.kv_bytes) {
        uint64_t pages = default_kv_tokens(&o) / o.kv_block_tokens;
        if (pages > (1u << 28))
            return TY_EINVAL;
        o.kv_pages = (uint32_t)pages;
    }
    ty_engine_t *e = calloc(1, sizeof(*e));
    if (!e)
        return TY_ENOMEM;
    e->m = m;
    e->max_ctx = o.max_ctx;
    e->max_batch = o.max_batch_tokens;
    const char *hang = getenv("TYCHO_TEST_HANG_FORWARD");
    e->hang_at = hang ? strtoull(hang, NULL, 10) : 0;
    e->tmp_logits = malloc((size_t)e->max_batch * c->n_vocab * sizeof(float));
    if (!e->tmp_logits || (rc = make_backend_and_pool(e, &o))) {
        ty_engine_free(e);
        return rc ? rc : TY_ENOMEM;
    }
    *out = e;
    return 0;
}

void ty_engine_free(ty_engine_t *e)
{
    if (!e)
        return;
    ty_kvpool_free(e->pool); /* before the backend: its page memory may be the backend's */
    ty_backend_free(e->be);
    free(e->tmp_logits);
    free(e);
}

ty_backend_t *ty_engine_backend(ty_engine_t *e)
{
    return e->be;
}

bool ty_engine_healthy(const ty_engine_t *e)
{
    return ty_backend_healthy(e->be);
}

ty_kvpool_t *ty_engine_pool(ty_engine_t *e)
{
    return e->pool;
}

const ty_model_t *ty_engine_model(const ty_engine_t *e)
{
    return e->m;
}

uint32_t ty_engine_max_batch_tokens(const ty_engine_t *e)
{
    return e->max_batch;
}

uint32_t ty_engine_max_ctx(const ty_engine_t *e)
{
    return e->max_ctx;
}


/* Run one sub-batch: the next <= max_batch tokens, starting at seq `*si`, token `*ti`, which
 * is token `*tok` of the whole batch (a stage's hidden rows go with their tokens). */
static int forward_chunk(ty_engine_t *e, const struct ty_batch *b, uint32_t *si, uint32_t *ti,
                         uint32_t *tok, float *logits, uint32_t *row)
{
    struct ty_batch_seq sub[64];
    uint32_t ns = 0, budget = e->max_batch, V = e->m->cfg.n_vocab;
    uint32_t first = *si, t0 = *tok;
    size_t D = e->m->cfg.dim;
    while (*si < b->n_seqs && budget && ns < 64) {
        const struct ty_batch_seq *s = &b->seqs[*si];
        uint32_t take = s->n - *ti < budget ? s->n - *ti : budget;
        sub[ns++] = (struct ty_batch_seq){s->seq, s->tokens + *ti, take, s->logits_all};
        budget -= take;
        *ti += take;
        if (*ti == s->n) {
            (*si)++;
            *ti = 0;
        }
    }
    *tok += e->max_batch - budget;
    struct ty_batch sb = {.seqs = sub, .n_seqs = ns, .layer_cb = b->layer_cb,
                          .layer_arg = b->layer_arg, .layer_begin = b->layer_begin,
                          .layer_end = b->layer_end,
                          .hidden_in = b->hidden_in ? b->hidden_in + t0 * D : NULL,
                          .hidden_out = b->hidden_out ? b->hidden_out + t0 * D : NULL};
    /* keep the rows the caller asked for: every row of logits_all sequences, and the last
     * token's row of a sequence whose final chunk this was. When the caller keeps every row
     * the backend makes (a decode step: one token per sequence), it writes them in place. */
    bool all_kept = true;
    for (uint32_t i = 0; i < ns && all_kept; i++)
        all_kept = sub[i].logits_all ||
                   sub[i].tokens + sub[i].n == b->seqs[first + i].tokens + b->seqs[first + i].n;
    float *out = b->hidden_out ? NULL : all_kept ? logits + (size_t)*row * V : e->tmp_logits;
    if (b->ids && all_kept) /* greedy rows: picked by the backend, in place */
        sb.ids = b->ids + *row;
    if (b->draws && all_kept) { /* draws: made by the backend, in place */
        sb.draws = b->draws + *row;
        sb.adj = b->adj;
        sb.samples = b->samples + *row;
    }
    int rc = ty_backend_forward(e->be, e->m, e->pool, &sb, out);
    if (rc)
        return rc;
    uint32_t r = 0;
    for (uint32_t i = 0; i < ns && b->hidden_out; i++) /* a stage before the last: no logits */
        if ((rc = ty_kvpool_seq_commit(e->pool, sub[i].seq, sub[i].tokens, sub[i].n)))
            return rc;
    for (uint32_t i = 0; i < ns && !b->hidden_out; i++) {
        const struct ty_batch_seq *orig = &b->seqs[first + i];
        bool last = sub[i].tokens + sub[i].n == orig->tokens + orig->n;
        uint32_t rows = sub[i].logits_all ? sub[i].n : 1;
        if (sub[i].logits_all || last) {
            for (uint32_t k = 0; k < rows && !all_kept && b->ids; k++) /* greedy rows, here */
                b->ids[*row + k] = ty_logits_argmax(e->tmp_logits + (size_t)(r + k) * V, V);
            for (uint32_t k = 0; k < rows && !all_kept && b->draws; k++) /* the caller draws */
                b->samples[*row + k].id = TY_SAMPLE_NOT_DRAWN;
            if (!all_kept && logits)
                memcpy(logits + (size_t)*row * V, e->tmp_logits + (size_t)r * V,
                       (size_t)rows * V * sizeof(float));
            *row += rows;
        }
        r += rows;
        if ((rc = ty_kvpool_seq_commit(e->pool, sub[i].seq, sub[i].tokens, sub[i].n)))
            return rc;
    }
    return 0;
}

int ty_engine_forward(ty_engine_t *e, const struct ty_batch *b, float *logits)
{
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        const struct ty_batch_seq *s = &b->seqs[i];
        if (!s->seq || !s->n)
            return TY_EINVAL;
        if ((uint64_t)ty_kvseq_n_tokens(s->seq) + s->n > e->max_ctx)
            return TY_ERANGE;
        int rc = ty_kvpool_seq_reserve(e->pool, s->seq, s->n);
        if (rc)
            return rc;
    }
    uint32_t si = 0, ti = 0, tok = 0, row = 0;
    atomic_store(&e->busy_since_ns, ty_clock_ns());
    if (++e->n_forward == e->hang_at) { /* a hung device or kernel, for the watchdog's tests */
        TY_LOG_WARN("engine", "test hook TYCHO_TEST_HANG_FORWARD: forward call %llu hangs",
                    (unsigned long long)e->n_forward);
        for (;;)
            pause();
    }
    int rc = 0;
    while (si < b->n_seqs && !rc)
        rc = forward_chunk(e, b, &si, &ti, &tok, logits, &row);
    atomic_store(&e->busy_since_ns, 0);
    return rc;
}

uint32_t ty_engine_seq_trim(ty_engine_t *e, ty_kvseq_t *s)
{
    uint32_t w = ty_model_config(e->m)->kv_window, next = ty_kvseq_n_tokens(s);
    if (!w || next + 1 <= w)
        return 0;
    return ty_kvpool_seq_release_before(e->pool, s, next + 1 - w);
}

uint64_t ty_engine_busy_ns(const ty_engine_t *e)
{
    uint64_t since = atomic_load(&((ty_engine_t *)e)->busy_since_ns);
    uint64_t now = ty_clock_ns();
    return since && now > since ? now - since : 0;
}

bool ty_gen_is_end(const struct ty_gen_params *g, const ty_model_t *m, uint32_t id)
{
    if (!g->ignore_eos && ty_model_is_eog(m, id))
        return true;
    for (uint32_t i = 0; i < g->n_stop_ids && i < TY_GEN_MAX_STOP_IDS; i++)
        if (g->stop_ids[i] == id)
            return true;
    return false;
}

void ty_gen_ban_ends(const struct ty_gen_params *g, uint32_t n_out, const uint32_t *eog,
                     size_t n_eog, ty_sampler_t *s)
{
    if (n_out >= g->min_tokens)
        return;
    uint32_t ban[TY_SAMPLE_MAX_BAN];
    size_t n = 0;
    for (size_t i = 0; !g->ignore_eos && i < n_eog && n < TY_SAMPLE_MAX_BAN; i++)
        ban[n++] = eog[i];
    for (uint32_t i = 0; i < g->n_stop_ids && i < TY_GEN_MAX_STOP_IDS && n < TY_SAMPLE_MAX_BAN;
         i++)
        ban[n++] = g->stop_ids[i];
    ty_sampler_ban_next(s, ban, n);
}

const char *ty_finish_name(enum ty_finish f)
{
    switch (f) {
    case TY_FINISH_LENGTH: return "length";
    case TY_FINISH_EOS: return "stop";
    case TY_FINISH_STOP: return "stop";
    case TY_FINISH_CTX: return "length";
    default: return "none";
    }
}

void ty_gen_result_clear(struct ty_gen_result *r)
{
    free(r->ids);
    free(r->text);
    free(r->samples);
    memset(r, 0, sizeof(*r));
}
