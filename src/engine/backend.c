/* Backend dispatch through the interface table. */
#include "backend-impl.h"

#include "tycho/errors.h"

#include <stddef.h>

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
