/* Backend dispatch through the interface table. */
#include "backend-impl.h"

#include "tycho/errors.h"
#include "tycho/model.h"
#include "tycho/sampling.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

uint32_t ty_batch_n_logits(const struct ty_batch *b)
{
    uint32_t n = 0;
    if (b->hidden_out)
        return 0;
    for (uint32_t i = 0; i < b->n_seqs; i++)
        n += b->seqs[i].logits_all ? b->seqs[i].n : 1;
    return n;
}

uint32_t ty_batch_n_tokens(const struct ty_batch *b)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < b->n_seqs; i++)
        n += b->seqs[i].n;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

int ty_batch_layers(const struct ty_batch *b, uint32_t n_layers, uint32_t *begin, uint32_t *end)
{
    *begin = b->layer_begin;
    *end = b->layer_begin || b->layer_end ? b->layer_end : n_layers;
    if (*begin >= *end || *end > n_layers)
        return TY_EINVAL;
    if (*begin > 0 && !b->hidden_in)
        return TY_EINVAL;
    if ((*end < n_layers) != (b->hidden_out != NULL))
        return TY_EINVAL;
    return 0;
}

static bool is_stage(const struct ty_batch *b)
{
    return b->layer_begin || b->layer_end || b->hidden_in || b->hidden_out;
}

void ty_backend_free(ty_backend_t *b)
{
    if (!b)
        return;
    ty_sampler_free(b->draw_scratch);
    b->iface->free(b);
}

/* Draws for a backend that does not make them: forward writes the rows, each is drawn here
 * (ty_sampler_draw with a scratch sampler: the draw's own parameters, this backend's one row
 * buffer), the result ty_sampler_sample gives. */
static int host_draws(ty_backend_t *b, const ty_model_t *m, ty_kvpool_t *pool,
                      const struct ty_batch *batch, float *logits)
{
    uint32_t V = ty_model_config(m)->n_vocab, n = ty_batch_n_logits(batch);
    if (!logits)
        return TY_EINVAL;
    if (!b->draw_scratch) {
        struct ty_sampling_params none = {0};
        int rc = ty_sampler_new(&b->draw_scratch, &none, V);
        if (rc)
            return rc;
    }
    struct ty_batch rows = *batch;
    rows.draws = NULL;
    rows.adj = NULL;
    rows.samples = NULL;
    int rc = b->iface->forward(b, m, pool, &rows, logits);
    for (uint32_t i = 0; i < n && !rc; i++)
        ty_sampler_draw(b->draw_scratch, logits + (size_t)i * V, &batch->draws[i],
                        batch->draws[i].n_adj ? batch->adj + batch->draws[i].adj_begin : NULL,
                        &batch->samples[i]);
    return rc;
}

const char *ty_backend_name(const ty_backend_t *b)
{
    return b->iface->name(b);
}

int ty_backend_forward(ty_backend_t *b, const ty_model_t *m, ty_kvpool_t *pool,
                       const struct ty_batch *batch, float *logits)
{
    if (!b || !m || !pool || !batch ||
        (!logits && !batch->hidden_out && !batch->ids && !batch->draws))
        return TY_EINVAL;
    if (batch->draws && (!batch->samples || batch->hidden_out))
        return TY_EINVAL; /* (adj may be NULL when no draw adjusts its row) */
    if (batch->draws && !b->iface->draws)
        return host_draws(b, m, pool, batch, logits);
    if (is_stage(batch)) {
        uint32_t lo, hi;
        if (ty_batch_layers(batch, ty_model_config(m)->n_layers, &lo, &hi))
            return TY_EINVAL;
        if (!b->iface->layer_ranges)
            return TY_ENOTSUP;
    }
    if (!batch->ids || batch->hidden_out || b->iface->greedy_ids)
        return b->iface->forward(b, m, pool, batch, logits);
    if (!logits) /* the rows are picked here, from the logits the backend writes */
        return TY_EINVAL;
    int rc = b->iface->forward(b, m, pool, batch, logits);
    uint32_t V = ty_model_config(m)->n_vocab, n = ty_batch_n_logits(batch);
    for (uint32_t i = 0; i < n && !rc; i++)
        batch->ids[i] = ty_logits_argmax(logits + (size_t)i * V, V);
    return rc;
}

int ty_backend_kv_storage(ty_backend_t *b, struct ty_kvpool_storage *out)
{
    if (!b || !out)
        return TY_EINVAL;
    memset(out, 0, sizeof(*out));
    if (!b->iface->kv_storage)
        return 0;
    int rc = b->iface->kv_storage(b, out);
    return rc < 0 ? rc : 1;
}

bool ty_backend_healthy(const ty_backend_t *b)
{
    return b && (!b->iface->healthy || b->iface->healthy(b));
}

int ty_backend_new_by_name(ty_backend_t **out, const char *name,
                           const struct ty_backend_cpu_opts *cpu_opts,
                           const struct ty_backend_cuda_opts *cuda_opts)
{
    *out = NULL;
    if (!name || !strcmp(name, "cpu"))
        return ty_backend_cpu_new(out, cpu_opts);
    if (!strcmp(name, "cuda"))
        return ty_backend_cuda_new(out, cuda_opts);
    return TY_EINVAL;
}

#ifndef TY_HAVE_CUDA
/* Built without CUDA (no toolkit, or -DTYCHO_CUDA=OFF): the CUDA backend does not exist. */
int ty_backend_cuda_new(ty_backend_t **out, const struct ty_backend_cuda_opts *opts)
{
    *out = NULL;
    return TY_ENOTSUP;
}
#endif
