/* store-bench: the runner, the tycho driver, an embedded pool and the memcpy baseline
 * (store_bench.h). Every system gets the same keys, sizes and client threads in the same run. */
#include "bench-impl.h"

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
    struct ty_store_master_opts mo = {.loop = &e->loop, .meta = {.lease_ms = 500}};
    int rc = ty_store_master_new(&e->master, &mo);
    if (rc == 0) {
        snprintf(e->addr, sizeof(e->addr), "127.0.0.1:%u", ty_store_master_port(e->master));
        struct ty_store_node_opts no = {
            .loop = &e->loop, .name = "bench-node", .master = e->addr, .dram_bytes = e->dram};
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
    t->buf = aligned_alloc(4096, (max_len + 4095) / 4096 * 4096);
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
                                           .remove = t_remove,
                                           .clear = t_clear};

/* ---- runner ---------------------------------------------------------------------------------- */

struct result {
    const char *system;
    uint64_t size;
    uint64_t ops, errors;
    double put_gbps, get_gbps;                 /* GB/s (1e9 bytes) */
    double put_p50, put_p99, get_p50, get_p99; /* microseconds */
};

struct run {
    const struct bench_drv *drv;
    uint64_t size, ops;
    pthread_barrier_t bar;
    uint64_t *put_ns, *get_ns; /* [thread * ops + i] */
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

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct run *r = w->r;
    void *ctx = r->drv->ctx_new(r->drv->shared, r->size);
    uint64_t errors = ctx ? 0 : 2 * r->ops;
    uint8_t *buf = ctx ? r->drv->buf(ctx) : NULL;
    for (uint64_t i = 0; buf && i < r->size; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13);
    char key[128];
    for (int phase = 0; phase < 2; phase++) {
        pthread_barrier_wait(&r->bar);
        for (uint64_t i = 0; ctx && i < r->ops; i++) {
            key_of(key, sizeof(key), r, w->id, i);
            if (phase == 0)
                memcpy(buf, &i, sizeof(i)); /* every value differs */
            uint64_t t0 = ty_clock_ns();
            int rc = phase == 0 ? r->drv->put(ctx, key, r->size) : r->drv->get(ctx, key, r->size);
            uint64_t dt = ty_clock_ns() - t0;
            uint64_t got = 0;
            if (rc == 0 && phase == 1)
                memcpy(&got, buf, sizeof(got));
            if (rc != 0 || (phase == 1 && got != i)) {
                if (errors++ == 0)
                    TY_LOG_WARN("store", "%s %s %s: %s", r->drv->name, phase ? "get" : "put", key,
                                rc ? ty_strerror(rc) : "wrong bytes");
            }
            (phase == 0 ? r->put_ns : r->get_ns)[w->id * r->ops + i] = dt;
        }
    }
    pthread_barrier_wait(&r->bar);
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

static void run_one(const struct bench_drv *drv, uint64_t size, uint32_t clients, uint64_t bytes,
                    struct result *out)
{
    struct run r = {.drv = drv, .size = size};
    r.ops = bytes / size / clients;
    if (r.ops < 8)
        r.ops = 8;
    size_t n = (size_t)r.ops * clients;
    r.put_ns = calloc(n, sizeof(uint64_t));
    r.get_ns = calloc(n, sizeof(uint64_t));
    TY_ASSERT(r.put_ns && r.get_ns);
    pthread_mutex_init(&r.mu, NULL);
    pthread_barrier_init(&r.bar, NULL, clients + 1);
    pthread_t th[clients];
    struct worker w[clients];
    for (uint32_t t = 0; t < clients; t++) {
        w[t] = (struct worker){.r = &r, .id = t};
        pthread_create(&th[t], NULL, worker_main, &w[t]);
    }
    pthread_barrier_wait(&r.bar);
    uint64_t t0 = ty_clock_ns();
    pthread_barrier_wait(&r.bar);
    uint64_t t1 = ty_clock_ns();
    pthread_barrier_wait(&r.bar);
    uint64_t t2 = ty_clock_ns();
    for (uint32_t t = 0; t < clients; t++)
        pthread_join(th[t], NULL);
    if (drv->clear)
        drv->clear(drv->shared);
    double total = (double)n * (double)size;
    *out = (struct result){.system = drv->name,
                           .size = size,
                           .ops = n,
                           .errors = r.errors,
                           .put_gbps = total / (double)(t1 - t0),
                           .get_gbps = total / (double)(t2 - t1)};
    out->put_p50 = pct_us(r.put_ns, n, 0.50);
    out->put_p99 = pct_us(r.put_ns, n, 0.99);
    out->get_p50 = pct_us(r.get_ns, n, 0.50);
    out->get_p99 = pct_us(r.get_ns, n, 0.99);
    pthread_barrier_destroy(&r.bar);
    free(r.put_ns);
    free(r.get_ns);
}

/* ---- memcpy baseline ---------------------------------------------------------------------------
 */

struct mc_arg {
    uint64_t size, n;
    pthread_barrier_t *bar;
};

static void *memcpy_thread(void *arg)
{
    struct mc_arg *a = arg;
    uint64_t arena = 256ull << 20; /* well beyond the caches: each block is fresh memory */
    uint8_t *src = malloc(arena), *dst = malloc(a->size);
    memset(src, 1, arena);
    memset(dst, 2, a->size);
    uint64_t blocks = arena / a->size;
    pthread_barrier_wait(a->bar);
    for (uint64_t i = 0; i < a->n; i++)
        memcpy(dst, src + (i % blocks) * a->size, a->size);
    __asm__ volatile("" : : "r"(dst) : "memory");
    pthread_barrier_wait(a->bar);
    free(src);
    free(dst);
    return NULL;
}

static double memcpy_gbps(uint64_t size, uint32_t threads)
{
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, threads + 1);
    pthread_t th[threads];
    struct mc_arg a = {.size = size, .n = (1ull << 30) / size, .bar = &bar};
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

/* ---- report ------------------------------------------------------------------------------------
 */

static const struct result *find(const struct result *r, size_t n, const char *sys, uint64_t size)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(r[i].system, sys) == 0 && r[i].size == size)
            return &r[i];
    return NULL;
}

static void print_table(FILE *out, const struct result *r, size_t n, const double *mc,
                        const struct ty_store_bench_opts *o, const char *transport)
{
    fprintf(out, "store-bench: %u clients, transport %s\n", o->clients, transport);
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
        fprintf(out, "ratios %7lluK: get vs memcpy(%u threads, %.2f GB/s) %.2fx",
                (unsigned long long)(o->sizes[s] >> 10), o->clients, mc[s], t->get_gbps / mc[s]);
        if (rd)
            fprintf(out, ", vs redis get %.2fx put %.2fx", t->get_gbps / rd->get_gbps,
                    t->put_gbps / rd->put_gbps);
        if (m)
            fprintf(out, ", vs memcached get %.2fx put %.2fx", t->get_gbps / m->get_gbps,
                    t->put_gbps / m->put_gbps);
        fprintf(out, "\n");
    }
}

static void print_json(FILE *out, const struct result *r, size_t n, const double *mc,
                       const struct ty_store_bench_opts *o, const char *transport)
{
    json_t *root = json_object(), *rows = json_array(), *base = json_array();
    json_object_set_new(root, "clients", json_integer(o->clients));
    json_object_set_new(root, "transport", json_string(transport));
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_object();
        json_object_set_new(x, "system", json_string(r[i].system));
        json_object_set_new(x, "size", json_integer((json_int_t)r[i].size));
        json_object_set_new(x, "ops", json_integer((json_int_t)r[i].ops));
        json_object_set_new(x, "errors", json_integer((json_int_t)r[i].errors));
        json_object_set_new(x, "put_gbps", json_real(r[i].put_gbps));
        json_object_set_new(x, "get_gbps", json_real(r[i].get_gbps));
        json_object_set_new(x, "put_p50_us", json_real(r[i].put_p50));
        json_object_set_new(x, "put_p99_us", json_real(r[i].put_p99));
        json_object_set_new(x, "get_p50_us", json_real(r[i].get_p50));
        json_object_set_new(x, "get_p99_us", json_real(r[i].get_p99));
        json_array_append_new(rows, x);
    }
    for (size_t s = 0; s < o->n_sizes; s++) {
        json_t *x = json_object();
        json_object_set_new(x, "size", json_integer((json_int_t)o->sizes[s]));
        json_object_set_new(x, "memcpy_gbps", json_real(mc[s]));
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
        run_one(&d, o->sizes[s], o->clients, o->bytes, &res[(*n)++]);
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
    struct ty_store_client_opts co = {
        .master = master, .transport = o.transport, .listen_host = o.listen_host};
    ty_store_client_t *c = NULL;
    rc = ty_store_client_new(&c, &co);
    struct result res[3 * TY_STORE_BENCH_SIZES_MAX];
    size_t n = 0;
    double mc[TY_STORE_BENCH_SIZES_MAX];
    if (rc == 0) {
        struct bench_drv d = tycho_drv;
        d.shared = c;
        for (size_t s = 0; s < o.n_sizes; s++)
            run_one(&d, o.sizes[s], o.clients, o.bytes, &res[n++]);
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
        mc[s] = memcpy_gbps(o.sizes[s], o.clients);
    const char *tr = o.transport ? o.transport : "auto";
    if (o.json)
        print_json(out, res, n, mc, &o, tr);
    else
        print_table(out, res, n, mc, &o, tr);
    return 0;
}
