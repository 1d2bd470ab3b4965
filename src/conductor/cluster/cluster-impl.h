/* Internals of ty_cluster_t (registry.c: nodes, RPC endpoint, heartbeat timeout; remote.c: the
 * serving backend, whose relayed tokens become text through tycho/stoptext.h). Everything runs
 * on the cluster's loop thread. Nodes live as long as the cluster (a dead node keeps its slot
 * and is revived by its next RegisterNode); requests are freed once finished and no RPC call
 * of theirs is pending. */
#ifndef TYCHO_CLUSTER_IMPL_H
#define TYCHO_CLUSTER_IMPL_H

#include "tycho/cluster.h"
#include "tycho/rpc.h"
#include "tycho/stoptext.h"
#include "tycho/tokenizer.h"
#include "tycho.pb-c.h"

#define TY_CLUSTER_MAX_NODES 256

struct ty__cnode {
    struct ty_cluster_node_info info;
    char segment[TY_XFER_NAME_MAX + 1];
    uint32_t block_tokens;
    uint64_t session, last_hb_ms;
    ty_rpc_client_t *rpc; /* to the node's RPC server; NULL while dead */
    bool lost;            /* connection dropped: reaped on the next tick */
    ty_cluster_t *c;
};

struct ty__creq {
    struct ty__creq *next;
    uint64_t id;  /* the serve id */
    uint64_t rid; /* the id nodes know the request by (unique for this Conductor's life) */
    uint32_t *prompt;
    uint32_t n_prompt, n_out;
    uint32_t n_cached; /* prompt tokens the prefill node reused (from the decode node) */
    struct ty_gen_params gen;
    struct ty__cnode *pnode, *dnode;
    Tycho__V1__DecodeAssignReply *dreply; /* kept to forward its KV destination */
    bool decode_pending, prefill_pending, stream_pending, finished, prefill_counted;
    uint64_t wait_until_ms; /* no node yet (Conductor just started): dispatch when one comes */
    struct ty_stoptext tx;  /* text of the relayed tokens, as ty_engine_generate makes it */
};

struct ty_cluster {
    struct ty_cluster_opts o;
    const ty_tokenizer_t *tok;
    ty_rpc_server_t *srv;
    uv_timer_t tick;
    struct ty__cnode *nodes[TY_CLUSTER_MAX_NODES];
    size_t n_nodes;
    struct ty__creq *reqs;
    uint64_t next_rid, next_session;
    uint64_t started_ms;
    bool closing;
    int n_closing;
    void (*close_cb)(void *);
    void *close_arg;
};

/* registry.c */
int ty__cluster_registry_start(ty_cluster_t *c);
/* The alive node of `role` with the fewest requests in flight, or NULL. */
struct ty__cnode *ty__cluster_pick(ty_cluster_t *c, int role);
/* Mark `n` dead: fail its requests, close its connection. */
void ty__cluster_node_down(ty_cluster_t *c, struct ty__cnode *n, const char *why);

/* remote.c */
extern const struct ty_serve_backend_i ty__cluster_backend_iface;
/* Fail every unfinished request that depends on node `n` (error `err`). */
void ty__cluster_fail_node(ty_cluster_t *c, struct ty__cnode *n, int err);
void ty__cluster_fail_all(ty_cluster_t *c, int err);
/* A node registered / the tick: dispatch or expire requests that wait for a first node. */
void ty__cluster_retry_waiting(ty_cluster_t *c);

#endif
