/* Master election for the KV pool through etcd (src/store/elect.c): a candidate holds a lease
 * (TTL seconds) and creates `key` = its address under it in one transaction; whoever created
 * the key leads until its lease lapses. Uses etcd's v3 JSON gateway over libcurl.
 *
 * Threading: the campaign and the keep-alive run on the elector's own thread; on_leader and
 * on_lost are delivered on `loop`'s thread (through a uv_async). ty_store_elect_new/free are
 * loop-thread calls. Ownership: strings in the options are copied.
 */
#ifndef TYCHO_STORE_ELECT_H
#define TYCHO_STORE_ELECT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct ty_store_elect ty_store_elect_t;
typedef void (*ty_store_elect_cb)(void *arg);

struct ty_store_elect_opts {
    uv_loop_t *loop;
    const char *endpoint;        /* "http://127.0.0.1:2379" */
    const char *key;             /* "/tycho/store/leader" */
    const char *value;           /* this candidate's master address, host:port */
    uint32_t ttl_s;              /* lease TTL; 0: 3 */
    ty_store_elect_cb on_leader; /* this candidate now leads */
    ty_store_elect_cb on_lost;   /* it led and lost the lease: stop serving at once */
    void *arg;
};

/* Start campaigning. Returns 0 or TY_EINVAL. */
int ty_store_elect_new(ty_store_elect_t **out, const struct ty_store_elect_opts *opts);

/* Stop; a leader revokes its lease so a standby takes over at once. Blocks for the thread. */
void ty_store_elect_free(ty_store_elect_t *e);

/* Read the current leader's value into out. Returns 0, TY_ENOTFOUND or TY_ERPC. Any thread. */
int ty_store_elect_leader(const char *endpoint, const char *key, char *out, size_t cap);

#endif
