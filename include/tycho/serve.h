/* The serving backend: what the API layer hands a validated, tokenized request to, and the
 * token events it gets back through the sink it installs (set_sink). An object is {iface,
 * context} (STYLE.md vtables). Implementations: the Conductor's remote backend (RPC to prefill
 * and decode nodes, src/conductor/remote.c) and, behind `tycho serve`'s mailbox
 * (src/cli/cmd_serve.c), the local engine worker (src/serve, ty_serve_worker).
 *
 * Threading, one rule: everything happens on the thread of the loop that runs the API.
 * submit, cancel, stats, status_json and set_sink are called there, and the sink is called
 * there, one event at a time: never from inside submit, but possibly from inside cancel (the
 * cancelled request's ERROR event). A backend whose work runs on other threads posts its
 * events to that loop before calling the sink (one mailbox: uv_async + queue).
 * Ownership: submit copies everything it needs from the request; an event and the text it
 * points to are borrowed for the duration of the sink's call.
 */
#ifndef TYCHO_SERVE_H
#define TYCHO_SERVE_H

#include "tycho/engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TY_SERVE_MAX_STOP 8

/* Why a backend refused a request at admission (submit returned TY_EREJECTED). */
struct ty_serve_reject {
    char code[48];          /* OpenAI-style error code, e.g. "ttft_slo" ("" : queue full) */
    char message[224];      /* for the client */
    uint32_t retry_after_s; /* when a retry may succeed (0: unknown) */
    bool no_retry;          /* no retry can cure it: the API answers x-should-retry: false and
                             * no Retry-After (the OpenAI SDKs would retry twice otherwise) */
};

/* One sequence to generate. The API turns an OpenAI request with n choices into n of these. */
struct ty_serve_request {
    uint64_t id; /* unique among live requests, chosen by the caller */
    const uint32_t *prompt;
    size_t n_prompt;
    struct ty_gen_params gen; /* sampling, max_tokens, ignore_eos, stop strings */
    struct ty_serve_reject *reject; /* optional: filled when submit returns TY_EREJECTED */
    const char *slo_class; /* SLO class by name (the API's service_tier); NULL, "auto" or a
                            * name the backend has no class for: its default class */
    const char *client_id; /* the HTTP request's x-request-id (borrowed for the call): a
                            * backend carries it into its log lines and to its nodes */
    bool slo_class_strict; /* the client named the class itself (slo_class, or its API key's
                            * class): a backend with SLO classes refuses a name it has none
                            * for (TY_ENOTFOUND, reject->message naming those it has); one
                            * without classes serves it as any other */
};

enum ty_serve_event_kind {
    TY_SERVE_EV_TOKEN = 0, /* one output token (EOS is not reported as a token) */
    TY_SERVE_EV_DONE,      /* finished: finish reason and usage are set */
    TY_SERVE_EV_ERROR,     /* failed or cancelled: `error` is set; nothing follows */
};

struct ty_serve_event {
    uint64_t id;
    enum ty_serve_event_kind kind;
    struct ty_sample sample; /* TOKEN: id, logprob and top logprobs */
    const char *text;        /* TOKEN/DONE: new text, complete UTF-8 (may be empty); text held
                                back because it might start a stop string comes later */
    size_t text_len;
    enum ty_finish finish;   /* DONE */
    uint32_t n_prompt, n_cached, n_output; /* usage, set on every event */
    int error;               /* ERROR: TY_ECANCELED, TY_ENOCAPACITY, TY_ERANGE, ... */
    const char *message;     /* ERROR: what failed, for the client (NULL: the error's own
                              * wording); valid during the callback */
    uint32_t relay_us;       /* TOKEN: the backend's own time on the request between submit
                              * and this token (the Conductor: the decode node's reply turned
                              * into the PrefillAssign), not counting the nodes' compute; 0:
                              * not measured */
};

typedef void (*ty_serve_event_cb)(void *arg, const struct ty_serve_event *ev);

struct ty_serve_stats {
    uint32_t running, waiting; /* sequences in the batch / queued for admission */
    double kv_usage;           /* used fraction of KV pages, 0..1 */
    uint32_t max_ctx;          /* context length per sequence: prompt + output at most; the
                                * model's, or less where configured or where the KV cache
                                * holds less (a Conductor: the least of its own and its live
                                * nodes') */
    uint32_t kv_pages_total, kv_block_tokens;
    uint32_t kv_seq_tokens;    /* the most tokens the KV cache holds for one sequence (a
                                * Conductor: the smallest live node's); 0: not known */
    uint64_t steps;            /* forward steps run so far */
    uint64_t preemptions;      /* sequences whose KV pages were taken back to let older ones
                                * grow (recomputed when readmitted); 0 where none happen */
    bool ready;                /* it can serve now (a Conductor: a prefill and a decode node
                                * up); GET /ready answers 503 otherwise */
};

struct ty_serve_backend_i {
    /* Queue a request. Returns 0, TY_EREJECTED (queue full: retry later), TY_ESHUTDOWN,
     * TY_ERANGE (can never fit the context or the KV pool), TY_EINVAL or TY_ENOMEM. */
    int (*submit)(void *ctx, const struct ty_serve_request *req);
    /* Cancel a request: its sequence leaves the batch, its pages are freed, and an ERROR event
     * with TY_ECANCELED follows unless it already finished. Unknown ids are ignored. */
    int (*cancel)(void *ctx, uint64_t id);
    void (*stats)(void *ctx, struct ty_serve_stats *out);
    /* Optional (NULL): what the backend has to tell an operator beyond stats, as the text of
     * a JSON object (malloc'd; NULL on failure) whose members GET /status adds to its own:
     * the Conductor's scheduler settings and nodes. Called on the API's thread. */
    char *(*status_json)(void *ctx);
    /* Where the request's events go from now on: sink(arg, ev) on the loop's thread (the rule
     * above). The API sets it once, before its first submit; NULL drops events. Required of a
     * backend the API serves. */
    void (*set_sink)(void *ctx, ty_serve_event_cb sink, void *arg);
};

struct ty_serve_backend {
    const struct ty_serve_backend_i *iface;
    void *context;
};

#endif
