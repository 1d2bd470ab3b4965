/* Internals of the decode node (tycho/decode_node.h): node.c is the loop side (RPC handlers,
 * per-request token streams), node_worker.c the worker thread (reservations, KV arrival,
 * batched decode steps). They talk through a command list under `mu` (loop -> worker; the
 * transfer engine's notification callback also wakes the worker through `mu`/`cv`) and the RPC
 * mailbox (worker -> loop). */
#ifndef TYCHO_DECODE_NODE_IMPL_H
#define TYCHO_DECODE_NODE_IMPL_H

#include "tycho/decode_node.h"
#include "tycho/node_kvstore.h"
#include "tycho/proto.h"
#include "tycho/rpc.h"
#include "tycho.pb-c.h"

#include <pthread.h>

/* REARM: a known request's prefill is sent again (DecodeAssign.attempt > 1); EXTEND: its
 * prefill is making progress, its KV wait is extended (DecodeAssign.extend_wait) */
enum dcmd_kind { DCMD_ASSIGN, DCMD_CANCEL, DCMD_REARM, DCMD_EXTEND };

/* loop -> worker */
struct dcmd {
    struct dcmd *next;
    char cid[TY_CLIENT_ID_MAX + 1]; /* the client's request id (DecodeAssign): log lines */
    enum dcmd_kind kind;
    uint64_t rid;
    ty_rpc_call_t *call; /* REARM, EXTEND: answered by the loop once the worker looked */
    uint32_t *prompt;
    uint32_t n_prompt, max_tokens;
    bool ignore_eos;
    struct ty_sampling_params sp;
    uint32_t min_tokens, stop_ids[TY_GEN_MAX_STOP_IDS], n_stop_ids;
    struct ty_gen_grammar grammar; /* kind 0: none; schema points into grammar_schema */
    char *grammar_schema;
    uint32_t attempt; /* REARM: the new prefill attempt; EXTEND: the one making progress */
    uint64_t kv_wait_ms; /* DecodeAssign.deadline_ms: the Conductor's wait for the KV (0: none
                          * said; the node's kv_wait_timeout is the least) */
};

/* worker -> loop: what the worker says of a request. */
enum devent_kind {
    DEV_ASSIGN, /* its pages reserved (reply: packed DecodeAssignReply) or refused (rc) */
    DEV_REARM,  /* the answer to a REARM or an EXTEND (call) */
    DEV_TOKEN,  /* one token and/or its end (finish, rc) */
};

struct devent {
    ty_decode_node_t *n;
    enum devent_kind kind;
    uint64_t rid;
    ty_rpc_call_t *call; /* DEV_REARM: the unary call to answer */
    uint8_t *reply;
    size_t reply_len;
    int rc;
    bool has_token;
    struct ty_sample smp;
    int finish;        /* Tycho__V1__FinishReason */
    uint32_t n_cached; /* usage: prompt tokens the prefill node reused */
};

/* Loop-side state of a request: its DecodeAssign call, which is its token stream (the first
 * item the DecodeAssignReply, then the TokenChunks). */
struct lreq {
    struct lreq *next;
    uint64_t rid;
    ty_rpc_call_t *stream;
    uint32_t seq; /* the next TokenChunk's */
};

struct ty_decode_node {
    struct ty_decode_node_opts o;
    char *node_id;
    ty_node_service_t *svc; /* RPC server, worker thread, mailbox (tycho/node.h) */
    ty_rpc_mailbox_t *mb;   /* the service's */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct dcmd *cmds, **cmds_tail; /* under mu */
    bool stop;
    bool notified;                  /* under mu: a transfer notification (KvReady) came */
    struct ty_node_load load;       /* under mu, published by the worker */
    struct lreq *reqs;              /* loop */
    struct ty_node_kvstore *kvstore; /* the KV pool (worker; stats any thread); NULL: none */
    pthread_mutex_t fence_mu;        /* guards the fence entries (worker and transfer threads) */
    struct ty__fence *fences;        /* reservations waiting for KV: tag and pages */
    size_t n_fences, cap_fences;
    uint64_t *kv_base;               /* [2 * layer + (0 K, 1 V)]: each layer's page array */
    uint32_t n_kv_arrays;            /* 2 * layers */
    uint64_t kv_span;                /* bytes of one such array (pool_pages * page_bytes) */
    uint64_t page_bytes;
    void (*close_cb)(void *);
    void *close_arg;
};

/* A reservation whose KV the fence takes: writes tagged `tag` into its pages only. */
struct ty__fence {
    uint32_t tag;
    uint32_t n_pages;
    uint32_t *pages; /* the reservation's page ids (a copy) */
};

/* node.c: a reservation's write tag becomes live with its pages (taken by the fence), or not
 * (pages NULL). Any thread. Returns 0 or TY_ENOMEM (then its writes are refused). */
int ty__decode_fence_set(ty_decode_node_t *n, uint32_t tag, const uint32_t *pages,
                         uint32_t n_pages);

/* node_worker.c */
void *ty__decode_node_worker(void *arg);
/* node.c: post an event to the loop (worker thread). */
void ty__decode_node_post(ty_decode_node_t *n, struct devent *ev);
void ty__dcmd_free(struct dcmd *c);

#endif
