/* `tycho store-bench` (src/store/bench.c, bench_peers.c): put and get throughput and latency
 * percentiles of the KV pool for a list of block sizes with N client threads, and the same
 * workload against Redis and memcached instances it starts on ephemeral loopback ports, plus a
 * memcpy baseline on this host; a table or JSON on `out`.
 *
 * Threading: ty_store_bench_run() blocks the calling thread and runs its own threads.
 * Ownership: the caller owns opts and out.
 */
#ifndef TYCHO_STORE_BENCH_H
#define TYCHO_STORE_BENCH_H

#include "tycho/store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TY_STORE_BENCH_SIZES_MAX 16
#define TY_STORE_BENCH_BATCH_MAX 256

struct ty_store_bench_opts {
    const char *master;      /* an existing pool's master; NULL: an embedded master + node */
    uint64_t dram_bytes;     /* embedded node's segment; 0: 1 GiB */
    const char *transport;   /* client transport: NULL/"auto", "tcp", "local" */
    const char *listen_host; /* client engine address; NULL: 127.0.0.1 */
    uint64_t sizes[TY_STORE_BENCH_SIZES_MAX];
    size_t n_sizes;        /* 0: 64K 256K 1M 4M */
    uint32_t clients;      /* threads; 0: 4 */
    uint32_t batch;        /* keys per tycho put/get call (batch forms); 0: 8. Redis and
                            * memcached do one key per request */
    uint32_t tcp_conns;    /* client engine's TCP connections per pool node; 0: engine's 4 */
    uint32_t reps;         /* timed get passes over the same keys (median, min, max reported;
                            * memcpy baseline as often); 0: 3, at most 32 */
    enum ty_store_verify verify; /* client get checksum policy (store.h) */
    bool xfer_checksum;    /* client engine: XXH3 per TCP slice */
    uint64_t bytes;        /* bytes put per size (all clients); 0: 256 MiB */
    bool redis, memcached; /* also run these peers (when installed) */
    bool json;
};

/* Run the benchmark. Returns 0, TY_EINVAL (batch or reps too large), or the first setup error (pool
 * unreachable, ...). */
int ty_store_bench_run(const struct ty_store_bench_opts *opts, FILE *out);

#endif
