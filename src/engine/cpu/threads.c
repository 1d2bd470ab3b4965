/* A small fork-join worker pool: run() publishes a task and bumps a generation counter, every
 * worker takes its slice, and the caller waits until all report done.
 *
 * Decode calls run() about ten times per layer (each matmul, attention), a few tens of
 * microseconds of work each at two threads, so waking a sleeping thread (a futex round trip
 * per worker, more when the scheduler is slow to place it) would cost a large share of the
 * step. Both sides therefore first poll the atomic counters for up to SPIN_NS, yielding the
 * core between polls, then sleep on the condition variables: back-to-back calls find the
 * workers awake, and an idle pool (between requests) costs no CPU after that short window.
 * The polls yield rather than busy-wait: on a machine with fewer free cores than threads a
 * busy-waiting thread takes the core the thread it waits for needs (measured: 2 threads on
 * a shared 2-core machine ran a decode step's matmuls 2x slower with pause-spinning, as
 * llama.cpp's spinning pool does there). The sleepers announce themselves (n_sleeping, caller_sleeping) before
 * re-checking the counter under the mutex, and the other side reads that announcement after
 * its own atomic update (all sequentially consistent), so one of the two always sees the
 * other: no wake-up is lost. */
#include "cpu-impl.h"

#include "tycho/errors.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

/* How long a worker waits for the next task, and the caller for the workers, before
 * sleeping: longer than the serial work between two matmuls of a decode step (norms, rope,
 * the residual adds), short enough not to matter to an idle machine. */
#define SPIN_NS 50000

struct ty_cpu_pool {
    uint32_t n_threads; /* including the caller */
    pthread_t *tids;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    _Atomic uint64_t gen;      /* bumped by run() after it sets fn, arg and n */
    _Atomic uint32_t n_done;   /* workers finished with the current generation */
    _Atomic uint32_t n_sleeping; /* workers waiting on go (or about to) */
    _Atomic bool caller_sleeping;
    _Atomic bool stop;
    ty_cpu_task_cb fn;
    void *arg;
    uint32_t n;
};

struct worker_arg {
    ty_cpu_pool_t *p;
    uint32_t idx;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void slice(const ty_cpu_pool_t *p, uint32_t idx, uint32_t *b, uint32_t *e)
{
    uint64_t n = p->n;
    *b = (uint32_t)(n * idx / p->n_threads);
    *e = (uint32_t)(n * (idx + 1) / p->n_threads);
}

/* Whether SPIN_NS have passed since *t0 (0: not started; then starts it). */
static bool spun_out(uint64_t *t0)
{
    uint64_t t = now_ns();
    if (!*t0)
        *t0 = t;
    return t - *t0 > SPIN_NS;
}

/* Poll until gen differs from seen or the pool stops (true), or SPIN_NS pass (false). */
static bool spin_gen(ty_cpu_pool_t *p, uint64_t seen)
{
    uint64_t t0 = 0;
    while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) {
        if (spun_out(&t0))
            return false;
        sched_yield();
    }
    return true;
}

static void *worker(void *a)
{
    struct worker_arg *wa = a;
    ty_cpu_pool_t *p = wa->p;
    uint32_t idx = wa->idx;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        if (!spin_gen(p, seen)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (!atomic_load(&p->stop) && atomic_load(&p->gen) == seen)
                pthread_cond_wait(&p->go, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            break;
        seen = atomic_load(&p->gen);
        uint32_t b, e;
        slice(p, idx, &b, &e);
        if (b < e)
            p->fn(p->arg, idx, b, e);
        if (atomic_fetch_add(&p->n_done, 1) + 1 == p->n_threads - 1 &&
            atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
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
    atomic_store(&p->stop, true);
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

uint32_t ty__cpu_pool_threads(const ty_cpu_pool_t *p)
{
    return p->n_threads;
}

void ty__cpu_pool_run(ty_cpu_pool_t *p, uint32_t n, ty_cpu_task_cb fn, void *arg)
{
    if (p->n_threads == 1 || n < 2) {
        fn(arg, 0, 0, n);
        return;
    }
    /* the workers of the last generation have all reported (run() waited for them), so
     * none reads fn, arg or n until the increment below publishes the new ones */
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    atomic_store(&p->n_done, 0);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->n_sleeping)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }
    uint32_t b, e;
    slice(p, 0, &b, &e);
    if (b < e)
        fn(arg, 0, b, e);
    uint32_t want = p->n_threads - 1;
    uint64_t t0 = 0;
    while (atomic_load(&p->n_done) < want) {
        if (!spun_out(&t0)) {
            sched_yield();
            continue;
        }
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_sleeping, true);
        while (atomic_load(&p->n_done) < want)
            pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&p->caller_sleeping, false);
        pthread_mutex_unlock(&p->mu);
    }
}
