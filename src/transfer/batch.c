/* Batches: a fixed array of tasks, submitted in order, completed by transport threads through
 * ty__xfer_slice_done(). A task's counters are atomics; the batch mutex guards only submission
 * order and the wait condition, so status polling never blocks. */
#include "xfer-impl.h"

#include "tycho/errors.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

int ty_xfer_batch_new(ty_xfer_engine_t *e, size_t max_tasks, ty_xfer_batch_t **out)
{
    if (!e || !out || max_tasks == 0 || max_tasks > (1u << 24))
        return TY_EINVAL;
    struct ty_xfer_batch *b = calloc(1, sizeof(*b));
    if (!b)
        abort();
    b->tasks = calloc(max_tasks, sizeof(*b->tasks));
    if (!b->tasks) {
        free(b);
        return TY_ENOMEM;
    }
    b->engine = e;
    b->cap = max_tasks;
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = b;
    return 0;
}

int ty_xfer_batch_free(ty_xfer_batch_t *b)
{
    if (!b)
        return 0;
    /* Taking the mutex orders us after the last completer's unlock. */
    pthread_mutex_lock(&b->mu);
    size_t pending = atomic_load(&b->pending);
    pthread_mutex_unlock(&b->mu);
    if (pending)
        return TY_EBUSY;
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b->tasks);
    free(b);
    return 0;
}

void ty__xfer_task_start(struct ty__xfer_task *t, uint32_t slices)
{
    atomic_store(&t->slices_left, slices);
}

void ty__xfer_slice_done(struct ty__xfer_task *t, uint64_t bytes, int err)
{
    if (err) {
        int zero = 0;
        atomic_compare_exchange_strong(&t->err, &zero, err);
    } else {
        atomic_fetch_add(&t->bytes_done, bytes);
    }
    if (atomic_fetch_sub(&t->slices_left, 1) != 1)
        return;
    struct ty_xfer_batch *b = t->batch;
    ty_xfer_engine_t *e = b->engine;
    int final = atomic_load(&t->err);
    if (final) {
        atomic_fetch_add(&e->st.tasks_failed, 1);
    } else {
        atomic_fetch_add(&e->st.tasks_done, 1);
        atomic_fetch_add(t->op == TY_XFER_OP_WRITE ? &e->st.bytes_written : &e->st.bytes_read,
                         t->len);
    }
    pthread_mutex_lock(&b->mu);
    atomic_store(&t->state, final ? TY_XFER_TASK_FAILED : TY_XFER_TASK_DONE);
    if (atomic_fetch_sub(&b->pending, 1) == 1)
        pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* Check one request; *cuda tells whether its local memory is a cuda:N region. */
static int validate(ty_xfer_engine_t *e, const struct ty_xfer_request *r, bool *cuda)
{
    if (!r->segment || r->len == 0 || !r->local ||
        (r->op != TY_XFER_OP_READ && r->op != TY_XFER_OP_WRITE))
        return TY_EINVAL;
    const struct ty__xfer_region *reg = ty__xfer_regions_rdlock(e, (uintptr_t)r->local, r->len);
    if (!reg)
        return TY_EOUTOFRANGE;
    *cuda = reg->loc_kind == TY__XFER_LOC_CUDA;
    ty__xfer_regions_unlock(e);
    return 0;
}

int ty_xfer_batch_submit(ty_xfer_batch_t *b, const struct ty_xfer_request *reqs, size_t n)
{
    if (!b || (!reqs && n))
        return TY_EINVAL;
    bool cuda = false;
    for (size_t i = 0; i < n; i++) {
        int rc = validate(b->engine, &reqs[i], &cuda);
        if (rc)
            return rc;
    }
    pthread_mutex_lock(&b->mu);
    size_t base = atomic_load(&b->n);
    if (n > b->cap - base) {
        pthread_mutex_unlock(&b->mu);
        return TY_ENOSPC;
    }
    atomic_store(&b->n, base + n);
    atomic_fetch_add(&b->pending, n);
    for (size_t i = 0; i < n; i++) {
        struct ty__xfer_task *t = &b->tasks[base + i];
        memset(t, 0, sizeof(*t));
        t->batch = b;
        t->op = reqs[i].op;
        t->len = reqs[i].len;
        atomic_store(&t->state, TY_XFER_TASK_PENDING);
    }
    pthread_mutex_unlock(&b->mu);
    for (size_t i = 0; i < n; i++) {
        struct ty__xfer_task *t = &b->tasks[base + i];
        const struct ty_xfer_request *r = &reqs[i];
        bool dev = false;
        validate(b->engine, r, &dev);
        struct ty__xfer_slice_req sr = {t, r->op, r->local, r->remote, r->len, dev, b->fence};
        ty_xfer_segment_t *s = r->segment;
        int rc = s->iface->submit(s->context, &sr);
        if (rc) {
            ty__xfer_task_start(t, 1);
            ty__xfer_slice_done(t, 0, rc);
        }
        /* a segment's run of tasks ends: let go what its transport holds back (device copies
         * of the local transport complete together) */
        if (s->iface->flush && (i + 1 == n || reqs[i + 1].segment != s))
            s->iface->flush(s->context);
    }
    return 0;
}

int ty_xfer_batch_status(ty_xfer_batch_t *b, size_t i, struct ty_xfer_task_status *out)
{
    if (!b || !out || i >= b->cap)
        return TY_EINVAL;
    if (i >= atomic_load(&b->n)) {
        memset(out, 0, sizeof(*out));
        return 0;
    }
    struct ty__xfer_task *t = &b->tasks[i];
    out->state = (enum ty_xfer_task_state)atomic_load(&t->state);
    out->bytes_done = atomic_load(&t->bytes_done);
    out->err = out->state == TY_XFER_TASK_FAILED ? atomic_load(&t->err) : 0;
    return 0;
}

int ty_xfer_batch_wait(ty_xfer_batch_t *b, uint32_t timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&b->mu);
    int rc = 0;
    while (atomic_load(&b->pending) > 0 && rc == 0)
        rc = pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    bool pending = atomic_load(&b->pending) > 0;
    size_t n = atomic_load(&b->n);
    pthread_mutex_unlock(&b->mu);
    if (pending)
        return TY_EBUSY;
    for (size_t i = 0; i < n; i++)
        if (atomic_load(&b->tasks[i].state) == TY_XFER_TASK_FAILED)
            return atomic_load(&b->tasks[i].err);
    return 0;
}

void ty_xfer_batch_set_fence(ty_xfer_batch_t *b, uint32_t fence)
{
    b->fence = fence;
}
