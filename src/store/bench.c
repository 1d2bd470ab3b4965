/* store-bench: the runner, the tycho driver, an embedded pool and the memcpy baseline
 * (store_bench.h). Every system gets the same keys, sizes and client threads in the same run. */
#include "bench-impl.h"

#include "tycho/auth.h"
#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/store.h"
#include "tycho/store_bench.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BUF_ALIGN (2u << 20)

/* ---- embedded pool: master + one node on a loop thread -------------------------------------- */

struct embedded {
    pthread_t thr;
    uv_loop_t loop;
    uv_async_t stop;
    ty_store_master_t *master;
    ty_store_node_t *node;
    uint64_t dram;
    char addr[64];
    int rc;
    bool ready;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void emb_on_stop(uv_async_t *a)
{
    struct embedded *e = a->data;
    ty_store_node_close(e->node, NULL, NULL);
    ty_store_master_close(e->master, NULL, NULL);
    uv_close((uv_handle_t *)&e->stop, NULL);
}

static void *emb_thread(void *arg)
{
    struct embedded *e = arg;
    uv_loop_init(&e->loop);
    struct ty_store_master_opts mo = {
        .loop = &e->loop, .meta = {.lease_ms = 500}, .auth = ty_auth_from_env()};
    int rc = ty_store_master_new(&e->master, &mo);
    if (rc == 0) {
        snprintf(e->addr, sizeof(e->addr), "127.0.0.1:%u", ty_store_master_port(e->master));
        struct ty_store_node_opts no = {
            .loop = &e->loop, .name = "bench-node", .master = e->addr, .dram_bytes = e->dram,
            .auth = ty_auth_from_env()};
        rc = ty_store_node_new(&e->node, &no);
        if (rc != 0)
            ty_store_master_close(e->master, NULL, NULL);
    }
    uv_async_init(&e->loop, &e->stop, emb_on_stop);
    e->stop.data = e;
    pthread_mutex_lock(&e->mu);
    e->rc = rc;
    e->ready = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (rc != 0)
        uv_close((uv_handle_t *)&e->stop, NULL);
    uv_run(&e->loop, UV_RUN_DEFAULT);
    uv_loop_close(&e->loop);
    return NULL;
}

static int emb_start(struct embedded *e, uint64_t dram)
{
    memset(e, 0, sizeof(*e));
    e->dram = dram;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_create(&e->thr, NULL, emb_thread, e);
    pthread_mutex_lock(&e->mu);
    while (!e->ready)
        pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    if (e->rc != 0)
        pthread_join(e->thr, NULL);
    return e->rc;
}

static void emb_stop(struct embedded *e)
{
    uv_async_send(&e->stop);
    pthread_join(e->thr, NULL);
}

/* ---- the tycho driver ------------------------------------------------------------------------ */

struct tctx {
    ty_store_client_t *c;
    uint8_t *buf;
};

static void *t_new(void *shared, size_t max_len)
{
    struct tctx *t = calloc(1, sizeof(*t));
    TY_ASSERT(t != NULL);
    t->c = shared;
    /* 2 MiB aligned and advised for huge pages, as a serving process's KV buffers would be */
    size_t cap = (max_len + BUF_ALIGN - 1) / BUF_ALIGN * BUF_ALIGN;
    t->buf = aligned_alloc(BUF_ALIGN, cap);
    if (t->buf)
        madvise(t->buf, cap, MADV_HUGEPAGE);
    if (!t->buf || ty_store_client_register(t->c, t->buf, max_len) != 0) {
        free(t->buf);
        free(t);
        return NULL;
    }
    return t;
}

static void t_free(void *ctx)
{
    struct tctx *t = ctx;
    ty_store_client_unregister(t->c, t->buf);
    free(t->buf);
    free(t);
}

static uint8_t *t_buf(void *ctx)
{
    return ((struct tctx *)ctx)->buf;
}

static int t_put(void *ctx, const char *key, size_t len)
{
    struct tctx *t = ctx;
    int rc;
    for (int i = 0;
         (rc = ty_store_client_put(t->c, key, t->buf, len)) == TY_ENOCAPACITY && i < 3000; i++)
        ty_sleep_ns(1000000);
    return rc;
}

static int t_get(void *ctx, const char *key, size_t len)
{
    struct tctx *t = ctx;
    uint64_t got;
    int rc = ty_store_client_get(t->c, key, t->buf, len, &got);
    return rc == 0 && got != len ? TY_EPROTO : rc;
}

/* Put the batch; keys refused with TY_ENOCAPACITY (the pool is evicting) are put again alone
 * until they land, as the single put does. */
static int t_put_batch(void *ctx, size_t n, const char *const *keys, size_t len, int *status)
{
    struct tctx *t = ctx;
    const void *bufs[TY_STORE_BENCH_BATCH_MAX] = {NULL};
    uint64_t lens[TY_STORE_BENCH_BATCH_MAX] = {0};
    for (size_t j = 0; j < n; j++) {
        bufs[j] = t->buf + j * len;
        lens[j] = len;
    }
    int rc = ty_store_client_put_batch(t->c, n, keys, bufs, lens, status);
    for (size_t j = 0; rc != 0 && j < n; j++)
        for (int i = 0; status[j] == TY_ENOCAPACITY && i < 3000; i++) {
            ty_sleep_ns(1000000);
            status[j] = ty_store_client_put(t->c, keys[j], bufs[j], len);
        }
    return rc;
}

static int t_get_batch(void *ctx, size_t n, const char *const *keys, size_t len, int *status)
{
    struct tctx *t = ctx;
    void *bufs[TY_STORE_BENCH_BATCH_MAX] = {NULL};
    uint64_t caps[TY_STORE_BENCH_BATCH_MAX] = {0}, got[TY_STORE_BENCH_BATCH_MAX] = {0};
    for (size_t j = 0; j < n; j++) {
        bufs[j] = t->buf + j * len;
        caps[j] = len;
    }
    int rc = ty_store_client_get_batch(t->c, n, keys, bufs, caps, got, status);
    for (size_t j = 0; j < n; j++)
        if (status[j] == 0 && got[j] != len)
            status[j] = rc = TY_EPROTO;
    return rc;
}

static int t_remove(void *ctx, const char *key)
{
    return ty_store_client_remove(((struct tctx *)ctx)->c, key);
}

/* Keys were removed one by one; their ranges return when the readers' leases end: wait for
 * that so the next size starts with an empty pool (nothing evicted under it). */
static int t_clear(void *shared)
{
    struct ty_store_meta_stats st;
    for (int i = 0; i < 500; i++) {
        if (ty_store_client_master_stats(shared, &st, NULL) != 0 || st.dram_used == 0)
            return 0;
        ty_sleep_ns(10 * 1000000ull);
    }
    return TY_ETIMEDOUT;
}

static const struct bench_drv tycho_drv = {.name = "tycho",
                                           .ctx_new = t_new,
                                           .ctx_free = t_free,
                                           .buf = t_buf,
                                           .put = t_put,
                                           .get = t_get,
                                           .put_batch = t_put_batch,
                                           .get_batch = t_get_batch,
                                           .remove = t_remove,
                                           .clear = t_clear};

/* ---- runner ---------------------------------------------------------------------------------- */

struct result {
    const char *system;
    uint64_t size;
    uint64_t ops, errors;
    uint32_t reps;
    double put_gbps, get_gbps;                 /* GB/s (1e9 bytes); get: median of the passes */
    double get_min, get_max;
    double put_p50, put_p99, get_p50, get_p99; /* microseconds */
};

struct run {
    const struct bench_drv *drv;
    uint64_t size, ops;
    uint32_t batch; /* keys per call for drivers with batch ops */
    uint32_t reps;  /* timed get passes over the same keys */
    pthread_barrier_t bar;
    /* put_ns[thread * ops + i], get_ns[pass * ops * clients + thread * ops + i]: latency of the
     * call that carried key i */
    uint64_t *put_ns, *get_ns;
    uint32_t clients;
    uint64_t errors;
    pthread_mutex_t mu;
};

struct worker {
    struct run *r;
    uint32_t id;
};

static void key_of(char *k, size_t cap, const struct run *r, uint32_t t, uint64_t i)
{
    snprintf(k, cap, "%s-%llu-%u-%llu", r->drv->name, (unsigned long long)r->size, t,
             (unsigned long long)i);
}

#define KEY_CAP 128

/* One timed call for keys i .. i+k of this worker (phase 0 put, p >= 1 get pass p); values at
 * buf + j*size
 * carry their key number in the first 8 bytes. Returns the number of failed keys. */
static uint64_t worker_call(struct worker *w, void *ctx, uint8_t *buf, int phase, uint64_t i,
                            size_t k)
{
    struct run *r = w->r;
    char kb[TY_STORE_BENCH_BATCH_MAX][KEY_CAP];
    const char *keys[TY_STORE_BENCH_BATCH_MAX];
    int st[TY_STORE_BENCH_BATCH_MAX];
    for (size_t j = 0; j < k; j++) {
        key_of(kb[j], KEY_CAP, r, w->id, i + j);
        keys[j] = kb[j];
        uint64_t v = i + j;
        if (phase == 0)
            memcpy(buf + j * r->size, &v, sizeof(v)); /* every value differs */
    }
    uint64_t t0 = ty_clock_ns();
    if (k > 1 || (phase == 0 ? r->drv->put_batch : r->drv->get_batch))
        (phase == 0 ? r->drv->put_batch : r->drv->get_batch)(ctx, k, keys, r->size, st);
    else
        st[0] = phase == 0 ? r->drv->put(ctx, keys[0], r->size) : r->drv->get(ctx, keys[0], r->size);
    uint64_t dt = ty_clock_ns() - t0, errors = 0;
    for (size_t j = 0; j < k; j++) {
        uint64_t got = 0;
        if (st[j] == 0 && phase >= 1)
            memcpy(&got, buf + j * r->size, sizeof(got));
        if (st[j] != 0 || (phase >= 1 && got != i + j)) {
            if (errors++ == 0)
                TY_LOG_WARN("store", "%s %s %s: %s", r->drv->name, phase ? "get" : "put", keys[j],
                            st[j] ? ty_strerror(st[j]) : "wrong bytes");
        }
        uint64_t pass = phase >= 1 ? (uint64_t)(phase - 1) * r->ops * r->clients : 0;
        (phase == 0 ? r->put_ns : r->get_ns)[pass + w->id * r->ops + i + j] = dt;
    }
    return errors;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct run *r = w->r;
    size_t nb = r->drv->get_batch && r->drv->put_batch && r->batch > 1 ? r->batch : 1;
    void *ctx = r->drv->ctx_new(r->drv->shared, r->size * nb);
    uint64_t errors = ctx ? 0 : 2 * r->ops;
    uint8_t *buf = ctx ? r->drv->buf(ctx) : NULL;
    for (uint64_t i = 0; buf && i < r->size * nb; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13);
    for (int phase = 0; phase <= (int)r->reps; phase++) {
        pthread_barrier_wait(&r->bar);
        for (uint64_t i = 0; ctx && i < r->ops; i += nb)
            errors += worker_call(w, ctx, buf, phase, i, r->ops - i < nb ? r->ops - i : nb);
    }
    pthread_barrier_wait(&r->bar);
    char key[KEY_CAP];
    for (uint64_t i = 0; ctx && r->drv->remove && i < r->ops; i++) {
        key_of(key, sizeof(key), r, w->id, i);
        r->drv->remove(ctx, key);
    }
    if (ctx)
        r->drv->ctx_free(ctx);
    pthread_mutex_lock(&r->mu);
    r->errors += errors;
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct_us(uint64_t *v, size_t n, double p)
{
    qsort(v, n, sizeof(*v), cmp_u64);
    size_t i = (size_t)(p * (double)(n - 1));
    return (double)v[i] / 1e3;
}

#define REPS_MAX 32

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median, min and max of v[0..n) (sorted in place). */
static void spread(double *v, size_t n, double *med, double *lo, double *hi)
{
    qsort(v, n, sizeof(*v), cmp_dbl);
    *med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    *lo = v[0];
    *hi = v[n - 1];
}

/* Start the workers and time each phase: t[0] before the puts, t[1] after them, t[1 + p]
 * after get pass p. */
static void run_phases(struct run *r, uint64_t *t)
{
    pthread_t th[r->clients];
    struct worker w[r->clients];
    for (uint32_t i = 0; i < r->clients; i++) {
        w[i] = (struct worker){.r = r, .id = i};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    for (uint32_t p = 0; p <= r->reps + 1; p++) {
        pthread_barrier_wait(&r->bar);
        t[p] = ty_clock_ns();
    }
    for (uint32_t i = 0; i < r->clients; i++)
        pthread_join(th[i], NULL);
}

static void run_one(const struct bench_drv *drv, uint64_t size, const struct ty_store_bench_opts *o,
                    struct result *out)
{
    struct run r = {
        .drv = drv, .size = size, .batch = o->batch, .reps = o->reps, .clients = o->clients};
    r.ops = o->bytes / size / r.clients;
    if (r.ops < 8)
        r.ops = 8;
    size_t n = (size_t)r.ops * r.clients;
    r.put_ns = calloc(n, sizeof(uint64_t));
    r.get_ns = calloc(n * r.reps, sizeof(uint64_t));
    TY_ASSERT(r.put_ns && r.get_ns);
    pthread_mutex_init(&r.mu, NULL);
    pthread_barrier_init(&r.bar, NULL, r.clients + 1);
    uint64_t t[REPS_MAX + 2];
    run_phases(&r, t);
    if (drv->clear)
        drv->clear(drv->shared);
    double total = (double)n * (double)size, g[REPS_MAX];
    for (uint32_t p = 0; p < r.reps; p++)
        g[p] = total / (double)(t[p + 2] - t[p + 1]);
    *out = (struct result){.system = drv->name,
                           .size = size,
                           .ops = n,
                           .reps = r.reps,
                           .errors = r.errors,
                           .put_gbps = total / (double)(t[1] - t[0])};
    spread(g, r.reps, &out->get_gbps, &out->get_min, &out->get_max);
    out->put_p50 = pct_us(r.put_ns, n, 0.50);
    out->put_p99 = pct_us(r.put_ns, n, 0.99);
    out->get_p50 = pct_us(r.get_ns, n * r.reps, 0.50);
    out->get_p99 = pct_us(r.get_ns, n * r.reps, 0.99);
    pthread_barrier_destroy(&r.bar);
    pthread_mutex_destroy(&r.mu);
    free(r.put_ns);
    free(r.get_ns);
}

/* ---- memcpy baseline ---------------------------------------------------------------------------
 */

struct mc_arg {
    uint64_t size, n, batch;
    pthread_barrier_t *bar;
};

static void *memcpy_thread(void *arg)
{
    struct mc_arg *a = arg;
    /* The copies a get makes: each block from fresh memory (well beyond the caches) into the
     * caller's buffer, which holds `batch` blocks like a tycho client's (a 1-block target
     * would stay in L2 and flatter the baseline against batched gets). */
    uint64_t arena = 256ull << 20;
    uint8_t *src = malloc(arena), *dst = malloc(a->size * a->batch);
    TY_ASSERT(src && dst);
    memset(src, 1, arena);
    memset(dst, 2, a->size * a->batch);
    uint64_t blocks = arena / a->size;
    pthread_barrier_wait(a->bar);
    for (uint64_t i = 0; i < a->n; i++)
        memcpy(dst + (i % a->batch) * a->size, src + (i % blocks) * a->size, a->size);
    __asm__ volatile("" : : "r"(dst) : "memory");
    pthread_barrier_wait(a->bar);
    free(src);
    free(dst);
    return NULL;
}

static double memcpy_gbps(uint64_t size, uint32_t threads, uint64_t batch)
{
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, threads + 1);
    pthread_t th[threads];
    struct mc_arg a = {.size = size, .n = (1ull << 30) / size, .batch = batch, .bar = &bar};
    for (uint32_t t = 0; t < threads; t++)
        pthread_create(&th[t], NULL, memcpy_thread, &a);
    pthread_barrier_wait(&bar);
    uint64_t t0 = ty_clock_ns();
    pthread_barrier_wait(&bar);
    uint64_t t1 = ty_clock_ns();
    for (uint32_t t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&bar);
    return (double)a.n * (double)size * threads / (double)(t1 - t0);
}

/* memcpy of `size` blocks with `threads` threads into `batch`-block targets, `reps` times:
 * out = {median, min, max}. */
static void memcpy_spread(uint64_t size, uint32_t threads, uint64_t batch, uint32_t reps,
                          double *out)
{
    double v[REPS_MAX];
    for (uint32_t i = 0; i < reps; i++)
        v[i] = memcpy_gbps(size, threads, batch);
    spread(v, reps, &out[0], &out[1], &out[2]);
}

/* ---- report ------------------------------------------------------------------------------------
 */

static const struct result *find(const struct result *r, size_t n, const char *sys, uint64_t size)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(r[i].system, sys) == 0 && r[i].size == size)
            return &r[i];
    return NULL;
}

static void print_table(FILE *out, const struct result *r, size_t n, const double (*mc)[3],
                        const struct ty_store_bench_opts *o, const char *transport)
{
    static const char *const vnames[] = {"auto", "always", "lease"};
    fprintf(out,
            "store-bench: %u clients, transport %s, tycho: %u keys per call, verify %s%s "
            "(latency: of the call carrying the key)\n",
            o->clients, transport, o->batch, vnames[o->verify],
            o->xfer_checksum ? ", tcp slice checksums" : "");
    fprintf(out, "%-10s %8s %7s %9s %9s %9s %9s %9s %9s %6s\n", "system", "size", "ops", "put GB/s",
            "put p50", "put p99", "get GB/s", "get p50", "get p99", "errors");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "%-10s %7lluK %7llu %9.3f %8.0fus %8.0fus %9.3f %8.0fus %8.0fus %6llu\n",
                r[i].system, (unsigned long long)(r[i].size >> 10), (unsigned long long)r[i].ops,
                r[i].put_gbps, r[i].put_p50, r[i].put_p99, r[i].get_gbps, r[i].get_p50,
                r[i].get_p99, (unsigned long long)r[i].errors);
    for (size_t s = 0; s < o->n_sizes; s++) {
        const struct result *t = find(r, n, "tycho", o->sizes[s]);
        const struct result *rd = find(r, n, "redis", o->sizes[s]);
        const struct result *m = find(r, n, "memcached", o->sizes[s]);
        if (!t)
            continue;
        fprintf(out,
                "ratios %7lluK: get %.2f GB/s (median of %u passes, min %.2f max %.2f) vs "
                "memcpy(%u threads, %.2f GB/s, min %.2f max %.2f) %.2fx",
                (unsigned long long)(o->sizes[s] >> 10), t->get_gbps, t->reps, t->get_min,
                t->get_max, o->clients, mc[s][0], mc[s][1], mc[s][2], t->get_gbps / mc[s][0]);
        if (rd)
            fprintf(out, ", vs redis get %.2fx put %.2fx", t->get_gbps / rd->get_gbps,
                    t->put_gbps / rd->put_gbps);
        if (m)
            fprintf(out, ", vs memcached get %.2fx put %.2fx", t->get_gbps / m->get_gbps,
                    t->put_gbps / m->put_gbps);
        fprintf(out, "\n");
    }
}

static void print_json(FILE *out, const struct result *r, size_t n, const double (*mc)[3],
                       const struct ty_store_bench_opts *o, const char *transport)
{
    json_t *root = json_object(), *rows = json_array(), *base = json_array();
    json_object_set_new(root, "clients", json_integer(o->clients));
    json_object_set_new(root, "transport", json_string(transport));
    json_object_set_new(root, "batch", json_integer(o->batch));
    json_object_set_new(root, "verify", json_integer(o->verify));
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_object();
        json_object_set_new(x, "system", json_string(r[i].system));
        json_object_set_new(x, "size", json_integer((json_int_t)r[i].size));
        json_object_set_new(x, "ops", json_integer((json_int_t)r[i].ops));
        json_object_set_new(x, "errors", json_integer((json_int_t)r[i].errors));
        json_object_set_new(x, "put_gbps", json_real(r[i].put_gbps));
        json_object_set_new(x, "get_gbps", json_real(r[i].get_gbps));
        json_object_set_new(x, "get_min_gbps", json_real(r[i].get_min));
        json_object_set_new(x, "get_max_gbps", json_real(r[i].get_max));
        json_object_set_new(x, "get_passes", json_integer(r[i].reps));
        json_object_set_new(x, "put_p50_us", json_real(r[i].put_p50));
        json_object_set_new(x, "put_p99_us", json_real(r[i].put_p99));
        json_object_set_new(x, "get_p50_us", json_real(r[i].get_p50));
        json_object_set_new(x, "get_p99_us", json_real(r[i].get_p99));
        json_array_append_new(rows, x);
    }
    for (size_t s = 0; s < o->n_sizes; s++) {
        json_t *x = json_object();
        json_object_set_new(x, "size", json_integer((json_int_t)o->sizes[s]));
        json_object_set_new(x, "memcpy_gbps", json_real(mc[s][0]));
        json_object_set_new(x, "memcpy_min_gbps", json_real(mc[s][1]));
        json_object_set_new(x, "memcpy_max_gbps", json_real(mc[s][2]));
        json_array_append_new(base, x);
    }
    json_object_set_new(root, "results", rows);
    json_object_set_new(root, "memcpy", base);
    json_dumpf(root, out, JSON_INDENT(2));
    fprintf(out, "\n");
    json_decref(root);
}

static void run_peer(const struct bench_drv *tmpl, struct bench_peer *p,
                     const struct ty_store_bench_opts *o, struct result *res, size_t *n)
{
    struct bench_drv d = *tmpl;
    d.shared = p;
    for (size_t s = 0; s < o->n_sizes; s++)
        run_one(&d, o->sizes[s], o, &res[(*n)++]);
    ty__store_bench_peer_stop(p);
}

int ty_store_bench_run(const struct ty_store_bench_opts *in, FILE *out)
{
    struct ty_store_bench_opts o = *in;
    static const uint64_t def[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20};
    if (o.n_sizes == 0) {
        memcpy(o.sizes, def, sizeof(def));
        o.n_sizes = 4;
    }
    o.clients = o.clients ? o.clients : 4;
    o.batch = o.batch ? o.batch : 8;
    o.reps = o.reps ? o.reps : 3;
    if (o.reps > REPS_MAX)
        return TY_EINVAL;
    if (o.batch > TY_STORE_BENCH_BATCH_MAX)
        return TY_EINVAL;
    o.bytes = o.bytes ? o.bytes : 256ull << 20;
    uint64_t max = 0;
    for (size_t s = 0; s < o.n_sizes; s++)
        max = o.sizes[s] > max ? o.sizes[s] : max;
    struct embedded emb;
    const char *master = o.master;
    int rc = 0;
    if (!master) {
        if ((rc = emb_start(&emb, o.dram_bytes ? o.dram_bytes : 1ull << 30)) != 0)
            return rc;
        master = emb.addr;
    }
    struct ty_store_client_opts co = {.master = master, .auth = ty_auth_from_env(),
                                      .transport = o.transport,
                                      .listen_host = o.listen_host,
                                      .tcp_conns = o.tcp_conns,
                                      .verify = o.verify,
                                      .xfer_checksum = o.xfer_checksum};
    ty_store_client_t *c = NULL;
    rc = ty_store_client_new(&c, &co);
    struct result res[3 * TY_STORE_BENCH_SIZES_MAX];
    size_t n = 0;
    double mc[TY_STORE_BENCH_SIZES_MAX][3]; /* median, min, max */
    if (rc == 0) {
        struct bench_drv d = tycho_drv;
        d.shared = c;
        for (size_t s = 0; s < o.n_sizes; s++)
            run_one(&d, o.sizes[s], &o, &res[n++]);
        ty_store_client_free(c);
    }
    if (!o.master)
        emb_stop(&emb);
    if (rc != 0)
        return rc;
    struct bench_peer p = {0};
    if (o.redis && ty__store_bench_redis_start(&p) == 0)
        run_peer(&ty__store_bench_redis, &p, &o, res, &n);
    else if (o.redis)
        fprintf(stderr, "store-bench: redis-server not available: skipped\n");
    if (o.memcached && ty__store_bench_memcached_start(&p, max) == 0)
        run_peer(&ty__store_bench_memcached, &p, &o, res, &n);
    else if (o.memcached)
        fprintf(stderr, "store-bench: memcached not available: skipped\n");
    for (size_t s = 0; s < o.n_sizes; s++)
        memcpy_spread(o.sizes[s], o.clients, o.batch, o.reps, mc[s]);
    const char *tr = o.transport ? o.transport : "auto";
    if (o.json)
        print_json(out, res, n, mc, &o, tr);
    else
        print_table(out, res, n, mc, &o, tr);
    return 0;
}
