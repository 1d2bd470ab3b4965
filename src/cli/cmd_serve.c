/* `tycho serve`: every role in one process. The OpenAI API (ty_api) on a libuv loop in the
 * main thread, the engine worker (ty_serve_worker, on the batcher) on its own thread, its events
 * brought to the loop by the mailbox below (tycho/serve.h: a backend's events arrive on the
 * API's loop), the daemon scaffolding for --config / --check-config / signals / sd_notify.
 * Its settings are
 * tycho-conductor's table plus an `engine:` section (ty_serve_config_table), so a
 * conductor.yaml serves here too. Given no model, it writes a small random-weight GGUF with
 * `tycho mkmodel` into a cache folder and says so. */
#include "cli.h"

#include "tycho/api.h"
#include "tycho/daemon.h"
#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/serve_local.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern const struct ty_cli_command ty_cli_cmd_mkmodel;

#define MAX_ARGS 256

/* ---- the mailbox: the worker's events, from its thread to the loop -------------------------
 * It is the backend the API sees: submit, cancel and stats go to the worker; the worker's
 * event callback (its thread) copies each event and its text into `in` under `mu` and wakes
 * the loop (uv_async) when `in` was empty; on the loop, `in` is swapped with `out` (both keep
 * their memory: no allocation per event once warm) and each event goes to the API's sink.
 * Not ty_rpc_mailbox: that one posts work items, a heap copy of every event and its text per
 * token; this one batches them in two buffers that are reused. */

struct mail {
    struct ty_serve_event ev; /* ev.text unset: the text is at text_off in the batch's texts */
    size_t text_off;
};

struct mail_batch {
    struct mail *m;
    size_t n, cap;
    char *text;
    size_t n_text, cap_text;
};

struct mailbox {
    struct ty_serve_backend inner; /* the worker; iface NULL once it is freed */
    uv_async_t async;
    pthread_mutex_t mu;
    struct mail_batch in;  /* under mu: filled by the worker's thread */
    struct mail_batch out; /* the loop's: the batch being delivered */
    ty_serve_event_cb sink; /* the loop's */
    void *sink_arg;
};

static void *grow(void *p, size_t *cap, size_t need, size_t el)
{
    if (need <= *cap)
        return p;
    size_t nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    if (!(p = realloc(p, nc * el)))
        abort(); /* small metadata allocation (STYLE.md) */
    *cap = nc;
    return p;
}

/* The worker's event callback: its thread. */
static void mailbox_post(void *arg, const struct ty_serve_event *ev)
{
    struct mailbox *mb = arg;
    pthread_mutex_lock(&mb->mu);
    struct mail_batch *b = &mb->in;
    bool wake = b->n == 0;
    b->m = grow(b->m, &b->cap, b->n + 1, sizeof(*b->m));
    b->text = grow(b->text, &b->cap_text, b->n_text + ev->text_len + 1, 1);
    struct mail *m = &b->m[b->n++];
    m->ev = *ev;
    m->ev.text = NULL;
    m->text_off = b->n_text;
    if (ev->text_len)
        memcpy(b->text + b->n_text, ev->text, ev->text_len);
    b->n_text += ev->text_len;
    b->text[b->n_text++] = 0;
    pthread_mutex_unlock(&mb->mu);
    if (wake)
        uv_async_send(&mb->async);
}

static void mailbox_deliver(uv_async_t *h)
{
    struct mailbox *mb = h->data;
    pthread_mutex_lock(&mb->mu);
    struct mail_batch b = mb->in;
    mb->in = mb->out;
    pthread_mutex_unlock(&mb->mu);
    for (size_t i = 0; i < b.n; i++) {
        b.m[i].ev.text = b.text + b.m[i].text_off;
        if (mb->sink)
            mb->sink(mb->sink_arg, &b.m[i].ev);
    }
    b.n = b.n_text = 0;
    mb->out = b;
}

static int mailbox_submit(void *ctx, const struct ty_serve_request *req)
{
    struct mailbox *mb = ctx;
    return mb->inner.iface ? mb->inner.iface->submit(mb->inner.context, req) : TY_ESHUTDOWN;
}

static int mailbox_cancel(void *ctx, uint64_t id)
{
    struct mailbox *mb = ctx;
    return mb->inner.iface ? mb->inner.iface->cancel(mb->inner.context, id) : 0;
}

static void mailbox_stats(void *ctx, struct ty_serve_stats *out)
{
    struct mailbox *mb = ctx;
    memset(out, 0, sizeof(*out));
    if (mb->inner.iface)
        mb->inner.iface->stats(mb->inner.context, out);
}

static char *mailbox_status_json(void *ctx)
{
    struct mailbox *mb = ctx;
    const struct ty_serve_backend_i *i = mb->inner.iface;
    return i && i->status_json ? i->status_json(mb->inner.context) : NULL;
}

static void mailbox_set_sink(void *ctx, ty_serve_event_cb sink, void *arg)
{
    struct mailbox *mb = ctx;
    mb->sink = sink;
    mb->sink_arg = arg;
}

static const struct ty_serve_backend_i mailbox_iface = {
    .submit = mailbox_submit, .cancel = mailbox_cancel, .stats = mailbox_stats,
    .status_json = mailbox_status_json, .set_sink = mailbox_set_sink};

static void mailbox_init(struct mailbox *mb, uv_loop_t *loop)
{
    memset(mb, 0, sizeof(*mb));
    pthread_mutex_init(&mb->mu, NULL);
    uv_async_init(loop, &mb->async, mailbox_deliver);
    mb->async.data = mb;
}

static void mailbox_closed(uv_handle_t *h)
{
    struct mailbox *mb = h->data;
    struct mail_batch *b[2] = {&mb->in, &mb->out};
    for (int i = 0; i < 2; i++) {
        free(b[i]->m);
        free(b[i]->text);
    }
    pthread_mutex_destroy(&mb->mu);
}

/* After the worker is freed (no more events): what is still queued is dropped. */
static void mailbox_close(struct mailbox *mb)
{
    mb->inner.iface = NULL;
    uv_close((uv_handle_t *)&mb->async, mailbox_closed);
}

/* ---- tycho serve ------------------------------------------------------------------------ */

struct serve {
    struct ty_serve_config cfg;
    ty_daemon_t *d;
    ty_model_t *model;
    ty_engine_t *engine;
    ty_serve_worker_t *worker;
    struct mailbox mb; /* the worker as the API's backend */
    bool mb_open;
    ty_metrics_registry_t *reg;
    ty_api_t *api;
    char random_model[PATH_MAX];
};

static void on_drained(void *arg)
{
    struct serve *s = arg;
    TY_LOG_INFO("serve", "drained; exiting");
    ty_daemon_stop(s->d);
}

static void on_drain(ty_daemon_t *d, void *arg)
{
    struct serve *s = arg;
    TY_LOG_INFO("serve", "draining %u request(s) in flight", ty_api_n_inflight(s->api));
    ty_api_drain(s->api, on_drained, s);
}

static bool serve_alive(void *arg, char *why, size_t cap)
{
    struct serve *s = arg;
    return ty_node_engine_alive(s->engine, s->cfg.engine.engine_stall_ns, why, cap);
}

static void on_reload(ty_daemon_t *d, unsigned n_changed, void *arg)
{
    struct serve *s = arg;
    ty_log_set_level((enum ty_log_level)s->cfg.conductor.log_level);
    ty_log_set_format((enum ty_log_format)s->cfg.conductor.log_format);
    const char **keys, **classes;
    size_t n;
    if (ty_conductor_api_keys(&s->cfg.conductor, &keys, &classes, &n) == 0) {
        ty_api_set_keys(s->api, keys, classes, n); /* no SLO classes here: ignored */
        free(keys);
        free(classes);
    } else {
        TY_LOG_ERROR("serve", "reload: out of memory, the API keys stay as they were");
    }
    ty_api_reload_tls(s->api, s->cfg.conductor.tls_cert, s->cfg.conductor.tls_key);
}

/* The vocabulary donor for a random model: stories260K from the shared test data when it is
 * there (so prompts tokenize like a real small model), else mkmodel's built-in byte vocabulary. */
static const char *find_vocab(void)
{
    static char buf[PATH_MAX];
    const char *env = getenv("TYCHO_VOCAB_FROM");
    if (env && !access(env, R_OK))
        return env;
    const char *roots[] = {getenv("TYCHO_TEST_DATA"), "../shared"};
    for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++) {
        if (!roots[i])
            continue;
        snprintf(buf, sizeof(buf), "%s/models/stories260K/stories260K.gguf", roots[i]);
        if (!access(buf, R_OK))
            return buf;
    }
    return "bytes";
}

/* Write (once) a small random-weight model into the cache and return its path. */
static int make_random_model(struct serve *s)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[PATH_MAX - 64];
    snprintf(dir, sizeof(dir), "%s%s/tycho", xdg ? xdg : home ? home : "/tmp",
             xdg ? "" : "/.cache");
    snprintf(s->random_model, sizeof(s->random_model), "%s/random-tiny.gguf", dir);
    fprintf(stderr,
            "tycho serve: no --model given: serving a small RANDOM-WEIGHT model (%s).\n"
            "tycho serve: its output is noise. Point it at a real model with\n"
            "tycho serve:   tycho serve --model /path/to/model.gguf  (or a Hugging Face "
            "model directory)\n", s->random_model);
    if (!access(s->random_model, R_OK))
        return 0;
    const char *vocab = find_vocab();
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", dir);
    if (system(cmd) != 0)
        return TY_EIO;
    char *argv[] = {"mkmodel", "--preset", "tiny", "--vocab-from", (char *)vocab,
                    "--out", s->random_model, NULL};
    return ty_cli_cmd_mkmodel.run(7, argv) ? TY_EIO : 0;
}

/* Rewrite the short flags into the daemon's --setting=value form and take our own. */
static int translate_args(struct serve *s, int argc, char **argv, char **out, int *n_out,
                          char *store, size_t store_len)
{
    bool have_model = false, have_config = false;
    int n = 0;
    size_t used = 0;
    out[n++] = argv[0];
    for (int i = 1; i < argc && n < MAX_ARGS - 2; i++) {
        const char *a = argv[i], *map = NULL;
        if (!strcmp(a, "--model")) map = "model_path";
        else if (!strcmp(a, "--port")) map = "listen_port";
        else if (!strcmp(a, "--host")) map = "listen_host";
        else if (!strcmp(a, "--api-key")) map = "api_keys";
        else if (!strcmp(a, "--tls-cert")) map = "tls_cert";
        else if (!strcmp(a, "--tls-key")) map = "tls_key";
        else if (!strcmp(a, "--chat-template")) map = "chat_template";
        else if (!strcmp(a, "--threads")) map = "engine.threads";
        else if (!strcmp(a, "--max-running")) map = "engine.max_batch_size";
        else if (!strcmp(a, "--step-tokens")) map = "engine.step_tokens";
        else if (!strcmp(a, "--backend")) map = "engine.backend";
        else if (!strcmp(a, "--device")) map = "engine.cuda_device";
        have_model |= !strncmp(a, "--model", 7);
        have_config |= !strncmp(a, "--config", 8) || !strcmp(a, "--help") ||
                       !strcmp(a, "--version");
        if (map && i + 1 >= argc) {
            fprintf(stderr, "tycho serve: %s needs a value\n", a);
            return TY_EINVAL;
        }
        if (!map) {
            out[n++] = argv[i];
            continue;
        }
        const char *v = argv[++i];
        int k = snprintf(store + used, store_len - used,
                         !strcmp(map, "api_keys") ? "--%s=[%s]" : "--%s=%s", map, v);
        if (k < 0 || (size_t)k >= store_len - used)
            return TY_EINVAL;
        out[n++] = store + used;
        used += (size_t)k + 1;
    }
    if (!have_model && !have_config && !getenv("TYCHO_MODEL_PATH")) {
        int rc = make_random_model(s);
        if (rc)
            return rc;
        int k = snprintf(store + used, store_len - used, "--model_path=%s", s->random_model);
        if (k < 0 || (size_t)k >= store_len - used)
            return TY_EINVAL;
        out[n++] = store + used;
    }
    out[n] = NULL;
    *n_out = n;
    return 0;
}

static int load_engine(struct serve *s, uv_loop_t *loop)
{
    const struct ty_conductor_config *c = &s->cfg.conductor;
    const struct ty_serve_engine_config *e = &s->cfg.engine;
    char err[512] = "";
    int rc = ty_model_load(&s->model, c->model_path, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "tycho serve: cannot load model %s: %s (%s)\n", c->model_path, err,
                ty_err_name(rc));
        return rc;
    }
    struct ty_engine_opts eo = {.n_threads = e->threads, .kv_block_tokens = e->kv_block_tokens,
                                .kv_pages = e->kv_pages, .kv_bytes = e->kv_cache_memory,
                                .max_seqs = e->max_batch_size,
                                .kv_dtype = ty_engine_kv_dtype_names[e->kv_cache_dtype],
                                .max_ctx = c->max_ctx,
                                .backend = ty_engine_backend_names[e->backend],
                                .cuda_device = (int)e->cuda_device,
                                .cuda_weights = ty_engine_cuda_weights_names[e->cuda_weights]};
    if ((rc = ty_engine_new(&s->engine, s->model, &eo))) {
        fprintf(stderr, "tycho serve: engine (backend %s): %s\n",
                ty_engine_backend_names[e->backend], ty_strerror(rc));
        return rc;
    }
    mailbox_init(&s->mb, loop);
    s->mb_open = true;
    struct ty_serve_worker_opts wo = {.engine = s->engine, .max_running = e->max_batch_size,
                                       .step_tokens = e->step_tokens, .event_cb = mailbox_post,
                                       .event_arg = &s->mb};
    if ((rc = ty_serve_worker_new(&s->worker, &wo))) {
        fprintf(stderr, "tycho serve: worker: %s\n", ty_strerror(rc));
        return rc;
    }
    s->mb.inner = ty_serve_worker_backend(s->worker);
    return 0;
}

/* "stories260K" from ".../stories260K.gguf" or ".../stories260K-hf/". */
static void model_name(const char *path, char *out, size_t cap)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/')
        start--;
    snprintf(out, cap, "%.*s", (int)(len - start), path + start);
    char *dot = strrchr(out, '.');
    if (dot && !strcmp(dot, ".gguf"))
        *dot = 0;
}

static int start_api(struct serve *s, uv_loop_t *loop)
{
    const struct ty_conductor_config *c = &s->cfg.conductor;
    char name[256];
    model_name(c->model_path, name, sizeof(name));
    const char **keys = NULL, **classes = NULL;
    size_t n_keys = 0;
    int rc = ty_metrics_registry_new(&s->reg);
    if (!rc)
        rc = ty_conductor_api_keys(c, &keys, &classes, &n_keys);
    struct ty_api_opts ao = {
        .host = c->listen_host, .port = c->listen_port, .model = s->model,
        .model_name = name, .model_path = c->model_path, .chat_template = c->chat_template,
        .backend = {&mailbox_iface, &s->mb}, .metrics = s->reg,
        .api_keys = keys, .api_key_classes = classes, .n_api_keys = n_keys,
        .max_body_bytes = c->limits.max_body_bytes,
        .header_timeout_ms = c->limits.header_timeout_ns / 1000000,
        .body_timeout_ms = c->limits.body_timeout_ns / 1000000,
        .max_connections = c->limits.max_connections, .tls_cert = c->tls_cert,
        .tls_key = c->tls_key};
    if (!rc)
        rc = ty_api_new(&s->api, loop, &ao);
    free(keys);
    free(classes);
    if (rc) {
        fprintf(stderr, "tycho serve: cannot start the API on %s:%u: %s%s\n",
                c->listen_host, c->listen_port, ty_strerror(rc),
                c->chat_template ? " (or its chat template: see the log)" : "");
        return rc;
    }
    fprintf(stderr, "tycho serve: serving %s (%s) on %s://%s:%u/v1%s%s\n", name,
            ty_model_desc(s->model), ty_api_tls(s->api) ? "https" : "http", c->listen_host,
            ty_api_port(s->api), ty_api_tls(s->api) ? ", certificate " : " (no TLS)",
            ty_api_tls(s->api) ? c->tls_cert : "");
    /* No RPC port here: "http_port 0", the format tycho-conductor writes. */
    return ty_node_write_ports(c->port_file, ty_api_port(s->api), 0, 0);
}

static int run_serve(int argc, char **argv)
{
    static struct serve s;
    char *args[MAX_ARGS], store[8192];
    int n_args = 0, code = 0;
    memset(&s, 0, sizeof(s));
    if (translate_args(&s, argc, argv, args, &n_args, store, sizeof(store)))
        return TY_CLI_EXIT_USAGE;
    struct ty_daemon_opts o = {.name = "tycho serve",
                               .summary = "all roles in one process: the OpenAI API over the "
                                          "local engine (also --model PATH, --port N, "
                                          "--host H, --threads N, --max-running N, "
                                          "--backend cpu|cuda, --device N, --tls-cert PEM, "
                                          "--tls-key PEM, --api-key KEY, --chat-template "
                                          "FILE)",
                               .table = &ty_serve_config_table, .config = &s.cfg,
                               .drain = on_drain, .reload = on_reload, .alive = serve_alive,
                               .arg = &s};
    if (ty_daemon_new(&s.d, &o, n_args, args, &code) != 0)
        return code;
    ty_log_set_level((enum ty_log_level)s.cfg.conductor.log_level);
    ty_log_set_format((enum ty_log_format)s.cfg.conductor.log_format);
    signal(SIGPIPE, SIG_IGN); /* a client that vanished mid-write is an error code, not death */
    uv_loop_t *loop = uv_default_loop();
    int ret = TY_CLI_EXIT_FAIL;
    if (load_engine(&s, loop) || start_api(&s, loop) || ty_daemon_start(s.d, loop))
        goto out;
    uv_run(loop, UV_RUN_DEFAULT);
    ret = TY_CLI_EXIT_OK;
out:
    ty_serve_worker_free(s.worker); /* no more events after this */
    if (s.mb_open)
        mailbox_close(&s.mb);
    if (s.api)
        ty_api_close(s.api, NULL, NULL);
    ty_daemon_free(s.d);
    uv_run(loop, UV_RUN_DEFAULT); /* close callbacks */
    ty_metrics_registry_free(s.reg);
    ty_engine_free(s.engine);
    ty_model_free(s.model);
    return ret;
}

const struct ty_cli_command ty_cli_cmd_serve = {
    "serve", "serve the OpenAI API with the local engine (all roles in one process)",
    run_serve};
