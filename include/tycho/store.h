/* The KV pool (docs/arch/store.md, after Mooncake Store): pool nodes lend DRAM (and SSD) to the cluster,
 * one master keeps metadata only, clients move bytes straight between their registered
 * buffers and the nodes' segments through the transfer engine.
 *
 * Three objects live here. A master service (ty_store_master_t) answers clients and nodes over
 * RPC and drives the pure metadata of store_meta.h. A pool node service (ty_store_node_t) owns a
 * DRAM segment registered with its transfer engine and optionally an SSD tier (store_ssd.h),
 * registers with the master, heartbeats and runs the master's jobs. A client
 * (ty_store_client_t) does put / get / exists / remove and their batch forms.
 *
 * Threading: a master and a node belong to the uv loop given at creation and are used only from
 * its thread (their I/O jobs run on libuv's thread pool). Every client function is safe from
 * any thread, concurrently; the client runs its own RPC thread. Ownership: callers own the
 * objects they create and the buffers they pass; keys and options are copied.
 */
#ifndef TYCHO_STORE_H
#define TYCHO_STORE_H

#include "tycho/store_meta.h"
#include "tycho/store_ssd.h"
#include "tycho/transfer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef void (*ty_store_closed_cb)(void *arg);

/* ---- master ------------------------------------------------------------------------------- */

typedef struct ty_store_master ty_store_master_t;

struct ty_store_master_opts {
    uv_loop_t *loop;
    const struct ty_auth *auth; /* the cluster secret of its port and of its calls to the pool
                                 * nodes; borrowed; NULL: insecure */
    const char *host; /* RPC listen address; NULL: 127.0.0.1 */
    uint16_t port;    /* 0: ephemeral */
    struct ty_store_meta_opts meta;
    uint32_t tick_ms; /* metadata tick period; 0: 10 */
    uint64_t epoch;   /* identifies this master's term; 0: wall-clock ms */
};

/* Start a master listening on host:port. Returns 0, TY_EINVAL, or the bind error. */
int ty_store_master_new(ty_store_master_t **out, const struct ty_store_master_opts *opts);
uint16_t ty_store_master_port(const ty_store_master_t *m);
/* Its metadata's counts (what `tycho store-stats` shows); loop thread. */
void ty_store_master_stats(const ty_store_master_t *m, struct ty_store_meta_stats *out);
/* Pool node `id` as its metadata knows it (name, DRAM, reads it was named first for); loop
 * thread. Returns 0, TY_ENOTFOUND (a free slot) or TY_EINVAL (id past the last slot). */
int ty_store_master_node_info(const ty_store_master_t *m, uint32_t id,
                              struct ty_store_node_info *out);
/* Stop serving and free the master once its handles closed; then cb(arg) (may be NULL). */
void ty_store_master_close(ty_store_master_t *m, ty_store_closed_cb cb, void *arg);

/* ---- pool node --------------------------------------------------------------------------- */

typedef struct ty_store_node ty_store_node_t;

struct ty_store_node_opts {
    uv_loop_t *loop;
    const struct ty_auth *auth; /* the cluster secret of its ports and of its calls to the
                                 * master; borrowed; NULL: insecure */
    const char *name;    /* stable across restarts; required */
    const char *host;    /* RPC and transfer listen address; NULL: 127.0.0.1 */
    uint16_t rpc_port;   /* job service; 0: ephemeral */
    uint16_t xfer_port;  /* transfer engine; 0: ephemeral */
    const char *master;  /* "host:port" of the master (comma-separated: tried in turn) */
    uint64_t dram_bytes; /* segment size; >= 1 MiB */
    const char *ssd_dir; /* NULL: no SSD tier */
    uint64_t ssd_bytes;  /* SSD tier capacity when ssd_dir is set */
    enum ty_store_ssd_direct ssd_direct;
    uint32_t heartbeat_ms; /* 0: 500 */
    bool xfer_checksum;    /* XXH3 per TCP slice in the transfer engine */
};

/* Allocate and touch the DRAM segment (huge pages where the kernel gives them), register it,
 * open the SSD tier, start the job service and begin registering with the master. Returns 0,
 * TY_EINVAL, TY_ENOMEM, or the error of the transfer engine / SSD tier / RPC server. */
int ty_store_node_new(ty_store_node_t **out, const struct ty_store_node_opts *opts);
uint16_t ty_store_node_rpc_port(const ty_store_node_t *n);
const char *ty_store_node_segment(const ty_store_node_t *n);
/* What a pool node holds and does (its /metrics); loop thread. */
struct ty_store_node_stats {
    uint64_t dram_bytes;               /* its DRAM segment */
    uint64_t dram_blocks, dram_used;   /* blocks the master placed there, and their bytes */
    bool registered;                   /* with a master now */
    uint32_t jobs;                     /* master jobs (offload, load, replicate) running */
    bool ssd;                          /* it has an SSD tier */
    uint64_t ssd_bytes, ssd_blocks, ssd_used, ssd_checksum_errors, ssd_buckets_evicted;
    uint64_t xfer_bytes_in, xfer_bytes_out; /* written into / read from it by peers */
    uint64_t xfer_refused;             /* peer accesses outside its regions */
};
void ty_store_node_stats(ty_store_node_t *n, struct ty_store_node_stats *out);
void ty_store_node_close(ty_store_node_t *n, ty_store_closed_cb cb, void *arg);

/* ---- client -------------------------------------------------------------------------------- */

typedef struct ty_store_client ty_store_client_t;

/* How a get checks the bytes it read against the key's committed XXH3-64 checksum (one more
 * pass over the value). Under every policy a read that may have outlived its lease (finished
 * later than request time + the lease the master granted, less 2 ms) is checked, and dropped on
 * a mismatch, so a freed or overwritten block is never returned; SSD-tier blocks are always
 * checked by the node when they are loaded and when they are offloaded. */
enum ty_store_verify {
    TY_STORE_VERIFY_AUTO = 0, /* check unless the transport vouches for the bytes: local (one
                               * memcpy out of the node's shared memory), rdma (ICRC), tcp with
                               * the engine's per-slice XXH3 (xfer_checksum); plain tcp: check */
    TY_STORE_VERIFY_ALWAYS,   /* check every get */
    TY_STORE_VERIFY_LEASE,    /* check only reads that outlived their lease (trusts TCP's own
                               * checksum on plain tcp) */
};

struct ty_store_client_opts {
    const char *master;       /* "host:port"; comma-separated list: followed on failover */
    const char *writer;       /* this process's pool node name: preferred for puts and gets */
    ty_xfer_engine_t *engine; /* borrowed; NULL: the client creates one */
    const char *listen_host;  /* for the client's own engine; NULL: 127.0.0.1 */
    uint32_t replicas;        /* per put; 0: the master's default */
    uint32_t timeout_ms;      /* per operation, retries included; 0: 10000 */
    uint64_t staging_bytes;   /* registered bounce buffer for unregistered memory; 0: 8 MiB */
    bool xfer_checksum;       /* XXH3 per TCP slice (own engine); with a borrowed engine: says
                               * that engine was made with `checksum` (for TY_STORE_VERIFY_AUTO) */
    const char *transport;    /* own engine: "auto" (NULL), "tcp", "local" */
    uint32_t tcp_conns;       /* own engine: TCP connections per pool node; 0: the engine's 4 */
    enum ty_store_verify verify;
    const struct ty_auth *auth; /* the cluster secret for the master and the own engine;
                                 * borrowed, outlives the client; NULL: insecure */
    uint32_t segments_max; /* pool segments kept open (a restarted node comes back under a new
                            * name); beyond, the least recently used idle one is closed; 0: 256.
                            * Soft: a transfer that needs more at once still gets them */
};

int ty_store_client_new(ty_store_client_t **out, const struct ty_store_client_opts *opts);
void ty_store_client_free(ty_store_client_t *c);

/* Register [addr, addr+len) with the client's engine so puts and gets on it are zero-copy.
 * Other memory goes through the staging buffer. Returns 0 or the engine's error. */
int ty_store_client_register(ty_store_client_t *c, void *addr, size_t len);
int ty_store_client_unregister(ty_store_client_t *c, void *addr);

/* Store `len` bytes under `key`: allocate, write every replica, commit. Returns 0, TY_EEXIST,
 * TY_ENOCAPACITY (the pool is full now), TY_EUNAVAIL (no node), a transfer error, TY_ERPC. */
int ty_store_client_put(ty_store_client_t *c, const char *key, const void *buf, uint64_t len);

/* Read the value of `key` into buf (cap bytes). Tries each replica until one reads and matches
 * its checksum. Returns 0 and *len, TY_ENOTFOUND (absent, or every replica failed cleanly:
 * never wrong bytes), TY_ENOSPC (cap too small; *len says the size), TY_ERPC. */
int ty_store_client_get(ty_store_client_t *c, const char *key, void *buf, uint64_t cap,
                        uint64_t *len);

int ty_store_client_remove(ty_store_client_t *c, const char *key);

/* Batch forms: one RPC per phase and one transfer batch for all n keys, so every key's transfer
 * is in flight at once, spread over the engine's connections to each node. status[i] gets each
 * key's result as the single form would return it; the function returns 0 when every status is
 * 0, else the first failing status (or an error that failed all of them). */
int ty_store_client_put_batch(ty_store_client_t *c, size_t n, const char *const *keys,
                              const void *const *bufs, const uint64_t *lens, int *status);
int ty_store_client_get_batch(ty_store_client_t *c, size_t n, const char *const *keys,
                              void *const *bufs, const uint64_t *caps, uint64_t *lens, int *status);
/* status[i]: 0 when keys[i] is present, TY_ENOTFOUND when not. */
int ty_store_client_exists_batch(ty_store_client_t *c, size_t n, const char *const *keys,
                                 int *status);

struct ty_store_client_stats {
    uint64_t puts, gets, hits;
    uint64_t replica_failovers;   /* a replica failed and another one was tried */
    uint64_t checksum_mismatches; /* bytes read that did not match: never returned */
    uint64_t lease_overruns;      /* a read outlived its lease: checked, kept only on a match */
    uint64_t master_switches;
    uint64_t verified;            /* reads checked against the checksum (enum ty_store_verify) */
    uint64_t unverified;          /* reads the policy let through unhashed (transport vouched) */
    uint64_t segments_open;       /* pool segments open now (<= segments_max when idle) */
    uint64_t segments_closed;     /* closed to make room for another */
};
void ty_store_client_stats(ty_store_client_t *c, struct ty_store_client_stats *out);

/* Stored/removed events of the pool (the Conductor's prefix index feed). `cb` runs on the
 * client's RPC thread for every event from now on, until the client is freed or the master
 * connection drops (then once with ev == NULL). With `snapshot`, first a STORED event for every
 * readable replica the pool holds now whose key starts with `prefix` (NULL: any), so a
 * subscriber's view starts complete; live events that follow may repeat some. Returns 0,
 * TY_EINVAL or TY_ESHUTDOWN. */
typedef void (*ty_store_event_cb)(const struct ty_store_event *ev, const char *node_name,
                                  void *arg);
int ty_store_client_subscribe_snapshot(ty_store_client_t *c, const char *prefix, bool snapshot,
                                       ty_store_event_cb cb, void *arg);

/* The master's counters (objects, nodes alive, DRAM use, evictions...) and its epoch. */
int ty_store_client_master_stats(ty_store_client_t *c, struct ty_store_meta_stats *out,
                                 uint64_t *epoch);

#endif
