/* Internals of the API front door shared by api_server.c (routing, lifecycle), api_gen.c
 * (generation requests and their responses), api_sse.c (streamed chunks written in place) and
 * api_misc.c (models, tokenize, metrics). Loop thread only: the backend's events come through
 * the sink on the same thread (tycho/serve.h). A generation request and everything it holds
 * live in its own arena, freed when it ends. */
#ifndef TYCHO_API_IMPL_H
#define TYCHO_API_IMPL_H

#include "api-tools.h"
#include "tycho/api.h"
#include "tycho/chat_template.h"
#include "tycho/http.h"
#include "tycho/tls.h"
#include "tycho/tokenizer.h"

#include <jansson.h>

#define TY__API_BUCKETS 1024
#define TY__API_CHOICE_BITS 5 /* backend id = (request seq << 5) | choice */
_Static_assert(TY_API_MAX_CHOICES <= (1 << TY__API_CHOICE_BITS) &&
                   TY_API_MAX_N <= TY_API_MAX_CHOICES,
               "every choice of a request needs its own backend id");

/* Choice i of a request with n choices per prompt answers prompt i / n (OpenAI's order:
 * index = prompt_index * n + j). */
struct ty__api_choice {
    uint64_t id;
    uint32_t prompt; /* index into ty__api_gen.prompts */
    bool done;
    bool started;    /* streaming: its first chunk (echo, prompt_token_ids) went out */
    enum ty_finish finish;
    char *text;       /* whole responses: the text so far (in the request's arena) */
    size_t n_text, cap_text;
    uint32_t *ids;    /* whole responses: the token ids so far (in the request's arena) */
    size_t n_ids, cap_ids;
    json_t *logprobs; /* accumulated (non-streaming) */
    uint32_t n_out;
    struct ty__api_out *out; /* chat whose output is parsed (tools, reasoning), else NULL */
};

/* One tokenized prompt of a request (chat: the rendered conversation). */
struct ty__api_prompt {
    uint32_t *ids; /* in the request's arena, as is echo */
    size_t n;
    char *echo; /* completions with echo: the prompt's text, else NULL */
    size_t n_echo;
    uint32_t n_cached; /* prefix-cache hit of its latest event */
};

struct ty__api_gen {
    struct ty__api_gen *hnext;
    ty_arena_t *arena; /* holds this struct, the parsed request, prompts and texts */
    ty_api_t *a;
    ty_http_req_t *http; /* NULL once the client left */
    uint64_t seq;
    struct ty_api_request req;
    struct ty__api_prompt prompts[TY_API_MAX_CHOICES];
    uint32_t n_prompts, n_choices; /* n_choices = n_prompts * req.n */
    char rid[40];
    char key_class[65]; /* the SLO class bound to the request's API key; "": none */
    int64_t created;
    uint64_t t0_ns, t_first_ns, t_last_ns;
    uint32_t n_done;
    bool streaming_started, failed;
    char *sse_head; /* streaming: {"id":..,"object":..,"created":..,"model":.., */
    size_t n_sse_head;
    struct ty__api_choice ch[TY_API_MAX_CHOICES];
};

struct ty_api {
    uv_loop_t *loop;
    ty_http_server_t *http;
    struct ty_api_opts o;
    struct ty_apikey *keys; /* (n_keys) as digests: plain and "sha256:" entries alike */
    char **key_classes; /* (n_keys) the SLO class bound to each key, NULL: none */
    size_t n_keys;
    char *model_name, *model_path;
    const ty_tokenizer_t *tok;
    ty_chat_tpl_t *tpl;    /* NULL: the model has no chat template (messages joined) */
    enum ty__api_fam fam;  /* the template's tool-call syntax */
    bool think;            /* its output may open with <think> */
    uint32_t max_ctx;      /* the backend's context as last seen (ty__api_max_ctx) */
    struct ty__api_gen *buckets[TY__API_BUCKETS];
    uint64_t next_seq;
    uint32_t n_inflight;
    bool draining;
    uint64_t started_ms; /* ty_clock_ms() at ty_api_new */
    void (*drain_done)(void *arg);
    void *drain_arg;
    void (*close_cb)(void *arg);
    void *close_arg;
    struct {
        ty_metrics_child_t *running, *waiting, *kv_usage, *ttft, *tpot, *itl, *e2e, *prompt,
            *gen, *cache_q, *cache_hit, *ok_stop, *ok_length, *ok_abort, *preempt;
        uint64_t preempt_seen; /* the backend's preemptions already added to *preempt */
        /* tycho_conductor_own_seconds{stage}: the front's own time per request up to its
         * first token (admit: arrival to submitted; relay: the backend's own share, from the
         * event; first_token: first token's event to its bytes handed to the socket) */
        ty_metrics_child_t *own_admit, *own_relay, *own_first;
    } m;
};

/* api_server.c */
void ty__api_send_error(ty_http_req_t *r, const struct ty_api_error *e);
void ty__api_send_json(ty_http_req_t *r, int status, json_t *o); /* steals o */
/* GET /status: the server's state for operators (`tycho status`). */
void ty__api_handle_status(ty_api_t *a, ty_http_req_t *r);
/* api_gen.c */
/* key_class: the SLO class bound to the request's API key (NULL: none). */
void ty__api_handle_generate(ty_api_t *a, ty_http_req_t *r, enum ty_api_kind kind,
                             const char *key_class);
/* The backend's sink (tycho/serve.h): `arg` is the ty_api_t. */
void ty__api_on_event(void *arg, const struct ty_serve_event *ev);
void ty__api_gen_abort_all(ty_api_t *a);
/* api_sse.c: streamed chunks, written into the response's output buffer */
int ty__api_sse_head(struct ty__api_gen *g); /* g->sse_head from rid, created, model */
/* A chunk for choice i: delta text (or role), optional logprobs, finish reason. A completion
 * choice's first chunk also carries its echoed prompt and, with return_token_ids, its
 * prompt_token_ids. */
void ty__api_sse_chunk(struct ty__api_gen *g, uint32_t i, const char *text, size_t len,
                       const struct ty_sample *smp, const char *role, enum ty_finish fin);
/* Chat deltas of a parsed output (api-tools.h): {"<key>": text} (key "content" or
 * "reasoning_content"); a tool call whole (its header chunk: index, id, type, name,
 * arguments "", then one with its arguments); the last chunk, delta {} and `reason`. */
void ty__api_sse_text(struct ty__api_gen *g, uint32_t i, const char *key, const char *text,
                      size_t len);
void ty__api_sse_call(struct ty__api_gen *g, uint32_t i, size_t index, const char *id,
                      const struct ty__api_call *call);
void ty__api_sse_finish(struct ty__api_gen *g, uint32_t i, const char *reason);
void ty__api_sse_usage(struct ty__api_gen *g, uint64_t in, uint64_t cached, uint64_t out);
/* api_misc.c */
/* The backend's context now (a Conductor's follows its live nodes), its stats in *st (may be
 * NULL); keeps a->max_ctx. The API's thread. */
uint32_t ty__api_max_ctx(ty_api_t *a, struct ty_serve_stats *st);
void ty__api_handle_models(ty_api_t *a, ty_http_req_t *r);
void ty__api_handle_tokenize(ty_api_t *a, ty_http_req_t *r);
void ty__api_handle_detokenize(ty_api_t *a, ty_http_req_t *r);
void ty__api_handle_metrics(ty_api_t *a, ty_http_req_t *r);
int ty__api_metrics_init(ty_api_t *a);
/* Load the chat template (override_path, else the model's) into a->tpl/fam/think. Returns
 * 0 (also for a model without one, logged) or the template's error, logged. */
int ty__api_tpl_load(ty_api_t *a, const char *override_path);
/* Render a chat request (q->tpl_json) with the template into malloc'd text. Returns 0 or
 * TY_EINVAL with err set (400, the template's message). */
int ty__api_render(ty_api_t *a, const struct ty_api_request *q, char **text,
                   struct ty_api_error *err);
/* Tokenize a chat conversation or completion prompt k (k is ignored for chat) into an array
 * in `arena`; *think_open (NULL: not wanted), chat: whether the rendered prompt ends inside a
 * <think> block. Returns 0 or TY_EINVAL with err set. */
int ty__api_tokenize(ty_api_t *a, ty_arena_t *arena, const struct ty_api_request *q, size_t k,
                     uint32_t **ids, size_t *n, bool *think_open, struct ty_api_error *err);
json_t *ty__api_piece_json(ty_api_t *a, uint32_t id);

#endif
