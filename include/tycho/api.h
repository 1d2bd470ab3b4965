/* The OpenAI-compatible API: request validation (pure, no sockets) and the front door that
 * serves /v1/chat/completions, /v1/completions, /v1/models, /tokenize, /detokenize, /health
 * and /metrics over tycho/http.h, handing generation to a tycho/serve.h backend.
 *
 * Threading: ty_api_parse_* are pure and thread-safe. A ty_api_t belongs to the loop it was
 * created on, and so do its backend's calls and events (tycho/serve.h's rule: the API installs
 * its sink with set_sink). Ownership: a parsed request's strings live in an arena (the
 * caller's, or its own that ty_api_request_clear frees); each generation request's memory
 * comes from one arena freed when it ends; the API borrows the model, backend and metrics
 * registry, which must outlive it.
 */
#ifndef TYCHO_API_H
#define TYCHO_API_H

#include "tycho/arena.h"
#include "tycho/metrics.h"
#include "tycho/model.h"
#include "tycho/serve.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

enum ty_api_kind {
    TY_API_CHAT = 0,   /* POST /v1/chat/completions */
    TY_API_COMPLETION, /* POST /v1/completions */
};

#define TY_API_MAX_N 16
#define TY_API_MAX_CHOICES 32 /* prompts x n per request (backend ids carry 5 choice bits) */
#define TY_API_MAX_MESSAGES 256
#define TY_API_MAX_TOOLS 128

struct ty_api_message {
    char *role;    /* system (developer too), user, assistant or tool */
    char *content; /* text parts joined by "\n"; "" for null */
};

/* tool_choice: none (tools are still shown to the template, as vLLM does; the output is
 * not parsed for calls), auto (the default with tools: calls parsed in the template's
 * family's syntax), required / a named function (the output is constrained to JSON calls). */
enum ty_api_tool_choice {
    TY_API_TOOL_CHOICE_NONE = 0,
    TY_API_TOOL_CHOICE_AUTO,
    TY_API_TOOL_CHOICE_REQUIRED,
    TY_API_TOOL_CHOICE_NAMED,
};

/* What the output is constrained to (response_format, or the tool choice), as
 * tycho/grammar.h's kinds. */
enum ty_api_grammar {
    TY_API_GRAMMAR_NONE = 0,
    TY_API_GRAMMAR_JSON_OBJECT = 1, /* = TY_GRAMMAR_JSON_OBJECT */
    TY_API_GRAMMAR_JSON_SCHEMA = 2, /* = TY_GRAMMAR_JSON_SCHEMA */
};

/* One completion prompt: text (non-empty) or token ids (at least one), never both. */
struct ty_api_prompt {
    char *text;
    uint32_t *ids;
    size_t n_ids;
};

/* A validated OpenAI request. Absent optional fields keep the defaults noted. */
struct ty_api_request {
    enum ty_api_kind kind;
    char *model;                 /* NULL: the served model */
    struct ty_api_message *msgs; /* chat */
    size_t n_msgs;
    struct ty_api_prompt *prompts; /* completion: 1..TY_API_MAX_CHOICES prompts */
    size_t n_prompts;              /* n_prompts * n <= TY_API_MAX_CHOICES */
    uint32_t n;                  /* choices per prompt, 1 */
    int64_t max_tokens;          /* -1: absent */
    float temperature;           /* 1 */
    float top_p;                 /* 1 */
    int32_t top_k;               /* -1 / 0: off */
    float min_p;                 /* 0 */
    bool has_seed;
    uint64_t seed;
    float presence_penalty, frequency_penalty; /* 0 */
    float repetition_penalty;    /* 1 */
    char *stop[TY_SERVE_MAX_STOP];
    size_t n_stop;
    bool stream, include_usage, ignore_eos;
    bool logprobs;               /* chat: logprobs=true; completion: logprobs=N given */
    uint32_t top_logprobs;       /* chat top_logprobs, completion logprobs N */
    bool return_token_ids;       /* vLLM extension: token_ids in choices, prompt_token_ids */
    bool echo;                   /* completion: prompt text before each choice's text */
    char service_tier[16];       /* "": absent; else auto, default, flex, scale or priority */
    char slo_class[65];          /* Tycho extension: the SLO class by name; "": absent */
    uint32_t stop_ids[TY_GEN_MAX_STOP_IDS], n_stop_ids; /* vLLM's stop_token_ids */
    uint32_t min_tokens;         /* vLLM's min_tokens (0: none) */
    uint32_t n_logit_bias;       /* OpenAI's logit_bias: token id -> bias in [-100, 100] */
    struct ty_logit_bias logit_bias[TY_SAMPLE_MAX_LOGIT_BIAS];
    /* chat: what the chat template renders, as compact JSON text: {"messages": [normalised
     * messages: role, content (a string), tool_calls with arguments as objects, tool_call_id,
     * name, reasoning_content], "tools"?, "add_generation_prompt", "chat_template_kwargs"?} */
    char *tpl_json;
    char *tools_json;            /* the validated tools array (JSON text), NULL: none */
    size_t n_tools;
    enum ty_api_tool_choice tool_choice;
    char *tool_name;             /* TY_API_TOOL_CHOICE_NAMED: the function */
    bool parallel_tool_calls;    /* true */
    bool add_generation_prompt;  /* vLLM extension, true */
    enum ty_api_grammar grammar; /* response_format json_object / json_schema, or the schema
                                  * of a required / named tool choice (which wins) */
    char *grammar_schema;        /* JSON_SCHEMA: the schema's JSON text */
    ty_arena_t *arena;           /* where its strings and arrays live */
    bool own_arena;              /* ty_api_parse_request's own: ty_api_request_clear frees it */
};

/* An OpenAI-shaped error: {"error":{"message","type","param","code"}} with an HTTP status. */
struct ty_api_error {
    int status;
    char message[256];
    char type[48];
    char param[48]; /* "" renders as null */
    char code[48];  /* "" renders as null */
    uint32_t retry_after_s; /* 429/503: the Retry-After header (0: 1 s for 429, 5 s for 503) */
    bool no_retry; /* 429: retrying cannot help: x-should-retry: false instead of Retry-After */
};

/* Parse and validate a request body, its strings and arrays allocated from `arena` (borrowed;
 * they live as long as it does). Returns 0, or TY_EINVAL with `err` filled (status 400,
 * `param` naming the offending field), or TY_ENOMEM (500). Never keeps pointers into `body`. */
int ty_api_parse_request_in(ty_arena_t *arena, const char *body, size_t len,
                            enum ty_api_kind kind, struct ty_api_request *out,
                            struct ty_api_error *err);
/* The same with an arena of its own, freed by ty_api_request_clear (nothing to clear after a
 * failure). */
int ty_api_parse_request(const char *body, size_t len, enum ty_api_kind kind,
                         struct ty_api_request *out, struct ty_api_error *err);
void ty_api_request_clear(struct ty_api_request *r);

/* Fill an error (printf-style message). Returns TY_EINVAL for use in `return`. */
int ty_api_error_set(struct ty_api_error *e, int status, const char *type, const char *param,
                     const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The JSON text of an error (malloc'ed, caller frees), or NULL on allocation failure. */
char *ty_api_error_json(const struct ty_api_error *e);

/* True when `s` (length n) is well-formed UTF-8. */
bool ty_api_utf8_valid(const char *s, size_t n);

/* ---- the front door --------------------------------------------------------------------- */

typedef struct ty_api ty_api_t;

struct ty_api_opts {
    const char *host;
    uint16_t port;                 /* 0: ephemeral */
    const ty_model_t *model;       /* for tokenizer and chat template */
    const char *model_name;        /* served model id ("stories260K") */
    const char *model_path;        /* also accepted as a model id */
    const char *chat_template;     /* a Jinja chat template file replacing the model's own
                                    * (--chat-template); NULL: the model's */
    struct ty_serve_backend backend;
    ty_metrics_registry_t *metrics;
    const char *const *api_keys;        /* NULL or empty: no authentication; each a token or
                                         * "sha256:<64 hex>" of one (tycho/tls.h) */
    const char *const *api_key_classes; /* NULL, or per key its SLO class (NULL: none) */
    size_t n_api_keys;
    size_t max_body_bytes;
    uint64_t header_timeout_ms, body_timeout_ms;
    uint32_t max_connections;
    size_t max_output_bytes;       /* a stream's bytes its client has not taken; over: the
                                    * request is cancelled (0: 4 MiB; tycho/http.h) */
    const char *tls_cert, *tls_key; /* PEM files: HTTPS (tycho/http.h); NULL: plain HTTP */
};

/* Start the HTTP server on `loop` and install the API's sink in the backend (set_sink: its
 * events must arrive on this loop's thread). Loads the chat template (the override, else the
 * model's; a model with none joins chat messages as plain text, logged once). Returns 0 or a
 * negative TY_E* (TY_EINVAL: a backend without set_sink; the chat template's error, logged
 * with its message: TY_ENOTSUP, TY_EPARSE, TY_ENOENT for a missing override file; bind
 * failure, ...). */
int ty_api_new(ty_api_t **out, uv_loop_t *loop, const struct ty_api_opts *opts);
uint16_t ty_api_port(const ty_api_t *a);
/* Whether the front door speaks HTTPS. */
bool ty_api_tls(const ty_api_t *a);
/* Re-read the certificate and key (SIGHUP): new connections use them. Returns 0, TY_EINVAL
 * (switching between http and https needs a restart) or TY_ECONFIG; on error, logged, the
 * running pair stays. Loop thread. */
int ty_api_reload_tls(ty_api_t *a, const char *cert, const char *key);
/* Stop taking generation requests (503) and call `done(arg)` on the loop once every request
 * in flight has finished. */
void ty_api_drain(ty_api_t *a, void (*done)(void *arg), void *arg);
/* Replace the accepted API keys (SIGHUP reload). Copies them. `classes` (NULL, or one entry
 * per key, NULL for none): the SLO class a key's requests are served in, whatever they ask
 * for (slo_class, service_tier). */
void ty_api_set_keys(ty_api_t *a, const char *const *keys, const char *const *classes,
                     size_t n);
/* Requests being generated right now. */
uint32_t ty_api_n_inflight(const ty_api_t *a);
/* Close the server (aborting what is left), uninstall the sink, then free; `cb(arg)` after. */
void ty_api_close(ty_api_t *a, void (*cb)(void *arg), void *arg);

#endif
