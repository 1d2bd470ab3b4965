/* Timing samples between heartbeats (tycho/timing_ring.h): a ring buffer under a mutex. */
#include "tycho/timing_ring.h"

#include "tycho/errors.h"

#include <pthread.h>
#include <stdlib.h>

struct ty_timing_ring {
    pthread_mutex_t mu;
    struct ty_timing_sample *s; /* (cap) */
    size_t cap, head, n;        /* head: the oldest */
    void (*observe)(void *arg, const struct ty_timing_sample *s); /* set before pushes */
    void *observe_arg;
};

int ty_timing_ring_new(ty_timing_ring_t **out, size_t cap)
{
    ty_timing_ring_t *r = calloc(1, sizeof(*r));
    *out = NULL;
    if (!r)
        return TY_ENOMEM;
    r->cap = cap ? cap : 64;
    if (!(r->s = malloc(r->cap * sizeof(*r->s)))) {
        free(r);
        return TY_ENOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return 0;
}

void ty_timing_ring_free(ty_timing_ring_t *r)
{
    if (!r)
        return;
    pthread_mutex_destroy(&r->mu);
    free(r->s);
    free(r);
}

void ty_timing_ring_observe(ty_timing_ring_t *r,
                            void (*cb)(void *arg, const struct ty_timing_sample *s), void *arg)
{
    r->observe = cb;
    r->observe_arg = arg;
}

void ty_timing_ring_push(ty_timing_ring_t *r, const struct ty_timing_sample *s)
{
    if (!r)
        return;
    if (r->observe)
        r->observe(r->observe_arg, s);
    pthread_mutex_lock(&r->mu);
    r->s[(r->head + r->n) % r->cap] = *s;
    if (r->n < r->cap)
        r->n++;
    else
        r->head = (r->head + 1) % r->cap;
    pthread_mutex_unlock(&r->mu);
}

size_t ty_timing_ring_take(ty_timing_ring_t *r, struct ty_timing_sample *out, size_t cap)
{
    pthread_mutex_lock(&r->mu);
    size_t skip = r->n > cap ? r->n - cap : 0, n = r->n - skip;
    for (size_t i = 0; i < n; i++)
        out[i] = r->s[(r->head + skip + i) % r->cap];
    r->head = r->n = 0;
    pthread_mutex_unlock(&r->mu);
    return n;
}
