/* A small fork-join worker pool: run() publishes a task under the mutex, bumps a generation
 * counter, every worker takes its slice, and the caller waits until all report done. */
#include "cpu-impl.h"

#include "tycho/errors.h"

#include <pthread.h>
#include <stdlib.h>

struct ty_cpu_pool {
    uint32_t n_threads; /* including the caller */
    pthread_t *tids;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    uint32_t n_done;
    bool stop;
    ty_cpu_task_cb fn;
    void *arg;
    uint32_t n;
};

struct worker_arg {
    ty_cpu_pool_t *p;
    uint32_t idx;
};

static void slice(const ty_cpu_pool_t *p, uint32_t idx, uint32_t *b, uint32_t *e)
{
    uint64_t n = p->n;
    *b = (uint32_t)(n * idx / p->n_threads);
    *e = (uint32_t)(n * (idx + 1) / p->n_threads);
}

static void *worker(void *a)
{
    struct worker_arg *wa = a;
    ty_cpu_pool_t *p = wa->p;
    uint32_t idx = wa->idx;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        uint32_t b, e;
        slice(p, idx, &b, &e);
        pthread_mutex_unlock(&p->mu);
        if (b < e)
            p->fn(p->arg, idx, b, e);
        pthread_mutex_lock(&p->mu);
        if (++p->n_done == p->n_threads - 1)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int ty__cpu_pool_new(ty_cpu_pool_t **out, uint32_t n_threads)
{
    ty_cpu_pool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return TY_ENOMEM;
    p->n_threads = n_threads ? n_threads : 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->tids = calloc(p->n_threads, sizeof(pthread_t));
    if (!p->tids) {
        free(p);
        return TY_ENOMEM;
    }
    for (uint32_t i = 1; i < p->n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof(*wa));
        if (wa) {
            wa->p = p;
            wa->idx = i;
        }
        if (!wa || pthread_create(&p->tids[i], NULL, worker, wa) != 0) {
            free(wa);
            p->n_threads = i; /* keep the ones that started */
            break;
        }
    }
    *out = p;
    return 0;
}

void ty__cpu_pool_free(ty_cpu_pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i < p->n_threads; i++)
        pthread_join(p->tids[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->tids);
    free(p);
}

void ty__cpu_pool_run(ty_cpu_pool_t *p, uint32_t n, ty_cpu_task_cb fn, void *arg)
{
    if (p->n_threads == 1 || n < 2) {
        fn(arg, 0, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->n_done = 0;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    uint32_t b, e;
    slice(p, 0, &b, &e);
    if (b < e)
        fn(arg, 0, b, e);
    pthread_mutex_lock(&p->mu);
    while (p->n_done < p->n_threads - 1)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
