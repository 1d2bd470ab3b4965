/* Backend dispatch through the interface table. */
#include "backend-impl.h"

#include "tycho/errors.h"

#include <stddef.h>
#include <string.h>

uint32_t ty_batch_n_logits(const struct ty_batch *b)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < b->n_seqs; i++)
        n += b->seqs[i].logits_all ? b->seqs[i].n : 1;
    return n;
}

void ty_backend_free(ty_backend_t *b)
{
    if (b)
        b->iface->free(b);
}

const char *ty_backend_name(const ty_backend_t *b)
{
    return b->iface->name(b);
}

int ty_backend_forward(ty_backend_t *b, const ty_model_t *m, ty_kvpool_t *pool,
                       const struct ty_batch *batch, float *logits)
{
    if (!b || !m || !pool || !batch || !logits)
        return TY_EINVAL;
    return b->iface->forward(b, m, pool, batch, logits);
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
