/* Internals of store-bench: one driver per system measured (bench.c: tycho;
 * bench_peers.c: Redis, memcached). A driver's per-thread context does one blocking op at a
 * time; each thread owns its context. */
#ifndef TYCHO_STORE_BENCH_IMPL_H
#define TYCHO_STORE_BENCH_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct bench_drv {
    const char *name;
    void *(*ctx_new)(void *shared, size_t max_len); /* NULL on failure; buf() of max_len */
    void (*ctx_free)(void *ctx);
    uint8_t *(*buf)(void *ctx); /* the thread's value buffer */
    int (*put)(void *ctx, const char *key, size_t len);
    int (*get)(void *ctx, const char *key, size_t len); /* into buf(); checks the length */
    /* optional: n keys in one call, value j at buf() + j * len; status[j] per key */
    int (*put_batch)(void *ctx, size_t n, const char *const *keys, size_t len, int *status);
    int (*get_batch)(void *ctx, size_t n, const char *const *keys, size_t len, int *status);
    int (*remove)(void *ctx, const char *key); /* optional: untimed cleanup per key */
    int (*clear)(void *shared);                         /* between sizes */
    void *shared;
};

/* A peer server this process started. */
struct bench_peer {
    pid_t pid;
    unsigned port;
};

/* Start redis-server / memcached on a free loopback port; 0, or TY_ENOTFOUND (not installed) or
 * TY_ETIMEDOUT (never accepted a connection). */
int ty__store_bench_redis_start(struct bench_peer *p);
int ty__store_bench_memcached_start(struct bench_peer *p, uint64_t max_item);
void ty__store_bench_peer_stop(struct bench_peer *p);
extern const struct bench_drv ty__store_bench_redis;
extern const struct bench_drv ty__store_bench_memcached;

#endif
