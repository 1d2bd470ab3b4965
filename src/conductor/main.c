/* tycho-conductor: the OpenAI HTTP front door (ty_api) over the Conductor's remote backend
 * (ty_conductor_t): nodes register on the RPC port, requests go to a prefill and a decode node.
 * One libuv loop in the main thread runs everything: the cluster's events go straight to the
 * API's sink (ty_api_new installs it). */
#include "tycho/api.h"
#include "tycho/conductor.h"
#include "tycho/daemon.h"
#include "tycho/engine.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/metrics.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct conductor {
    struct ty_conductor_config cfg;
    struct ty_auth auth; /* the cluster secret (cluster_secret_file) */
    ty_daemon_t *d;
    ty_model_t *model;
    ty_metrics_registry_t *reg;
    ty_conductor_t *cluster;
    ty_api_t *api;
};

static void on_drained(void *arg)
{
    struct conductor *s = arg;
    TY_LOG_INFO("conductor", "drained; exiting");
    ty_daemon_stop(s->d);
}

static void on_drain(ty_daemon_t *d, void *arg)
{
    struct conductor *s = arg;
    (void)d;
    TY_LOG_INFO("conductor", "draining %u request(s) in flight", ty_api_n_inflight(s->api));
    ty_api_drain(s->api, on_drained, s);
}

static void on_reload(ty_daemon_t *d, unsigned n_changed, void *arg)
{
    struct conductor *s = arg;
    (void)d;
    (void)n_changed;
    ty_log_set_level((enum ty_log_level)s->cfg.log_level);
    ty_log_set_format((enum ty_log_format)s->cfg.log_format);
    const char **keys, **classes;
    size_t n;
    if (ty_conductor_api_keys(&s->cfg, &keys, &classes, &n) == 0) {
        ty_api_set_keys(s->api, keys, classes, n);
        free(keys);
        free(classes);
    } else {
        TY_LOG_ERROR("conductor", "reload: out of memory, the API keys stay as they were");
    }
    ty_api_reload_tls(s->api, s->cfg.tls_cert, s->cfg.tls_key);
    ty_conductor_reload_sched(s->cluster, &s->cfg.scheduler);
}

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

static int start(struct conductor *s, uv_loop_t *loop)
{
    char err[512] = "", name[256];
    int rc = ty_model_load(&s->model, s->cfg.model_path, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "tycho-conductor: cannot load model %s: %s\n", s->cfg.model_path, err);
        return rc;
    }
    uint32_t ctx = ty_model_config(s->model)->ctx_len;
    uint32_t max_ctx = s->cfg.max_ctx ? s->cfg.max_ctx : ty_engine_default_ctx(ctx);
    struct ty_conductor_opts co = {
        .loop = loop, .rpc_host = s->cfg.rpc_host, .rpc_port = s->cfg.rpc_port, .auth = &s->auth,
        .model = s->model, .max_ctx = max_ctx,
        .heartbeat_interval_ms = (uint32_t)(s->cfg.heartbeat_interval_ns / 1000000),
        .heartbeat_timeout_ms = (uint32_t)(s->cfg.heartbeat_timeout_ns / 1000000),
        .request_timeout_ms = (uint32_t)(s->cfg.request_timeout_ns / 1000000),
        .node_answer_timeout_ms = (uint32_t)(s->cfg.node_answer_timeout_ns / 1000000),
        .breaker_failures = s->cfg.breaker_failures,
        .breaker_open_ms = (uint32_t)(s->cfg.breaker_open_ns / 1000000),
        .startup_wait_ms = (uint32_t)(s->cfg.startup_wait_ns / 1000000),
        .sched = &s->cfg.scheduler, .cost = &s->cfg.cost, /* events: the API's sink */
        .kv_pool_master = s->cfg.kv_pool.master, .pipeline = s->cfg.pipeline,
        .model_name = name, .expected_output_tokens = s->cfg.expected_output_tokens,
        .retry_after_only = !s->cfg.x_should_retry};
    model_name(s->cfg.model_path, name, sizeof(name));
    if ((rc = ty_metrics_registry_new(&s->reg)))
        return rc;
    co.metrics = s->reg;
    if ((rc = ty_conductor_new(&s->cluster, &co)) == TY_EINVAL) {
        fprintf(stderr, "tycho-conductor: the scheduler's settings are invalid (see the log)\n");
        return rc;
    } else if (rc) {
        fprintf(stderr, "tycho-conductor: cannot listen for nodes on %s:%u: %s\n",
                s->cfg.rpc_host, s->cfg.rpc_port, ty_strerror(rc));
        return rc;
    }
    const char **keys, **classes;
    size_t n_keys;
    if ((rc = ty_conductor_api_keys(&s->cfg, &keys, &classes, &n_keys)))
        return rc;
    struct ty_api_opts ao = {
        .host = s->cfg.listen_host, .port = s->cfg.listen_port, .model = s->model,
        .model_name = name, .model_path = s->cfg.model_path,
        .chat_template = s->cfg.chat_template,
        .backend = ty_conductor_backend(s->cluster), .metrics = s->reg,
        .api_keys = keys, .api_key_classes = classes, .n_api_keys = n_keys,
        .max_body_bytes = s->cfg.limits.max_body_bytes,
        .header_timeout_ms = s->cfg.limits.header_timeout_ns / 1000000,
        .body_timeout_ms = s->cfg.limits.body_timeout_ns / 1000000,
        .max_connections = s->cfg.limits.max_connections, .tls_cert = s->cfg.tls_cert,
        .tls_key = s->cfg.tls_key};
    rc = ty_api_new(&s->api, loop, &ao);
    free(keys);
    free(classes);
    if (rc) {
        fprintf(stderr, "tycho-conductor: cannot start the API on %s:%u: %s%s\n",
                s->cfg.listen_host, s->cfg.listen_port, ty_strerror(rc),
                s->cfg.chat_template ? " (or its chat template: see the log)" : "");
        return rc;
    }
    TY_LOG_INFO("conductor", "serving %s on %s://%s:%u/v1%s, nodes register at %s:%u", name,
                ty_api_tls(s->api) ? "https" : "http", s->cfg.listen_host, ty_api_port(s->api),
                ty_api_tls(s->api) ? "" : " (no TLS)", s->cfg.rpc_host,
                ty_conductor_rpc_port(s->cluster));
    return ty_node_write_ports(s->cfg.port_file, ty_api_port(s->api),
                                  ty_conductor_rpc_port(s->cluster), 0);
}

int main(int argc, char **argv)
{
    static struct conductor s;
    int code = 0;
    struct ty_daemon_opts o = {.name = "tycho-conductor",
                               .summary = "the Conductor: OpenAI API, node registry, routing "
                                          "to prefill and decode nodes",
                               .table = &ty_conductor_config_table, .config = &s.cfg,
                               .drain = on_drain, .reload = on_reload, .arg = &s,
                               .auth = &s.auth};
    if (ty_daemon_new(&s.d, &o, argc, argv, &code) != 0)
        return code;
    ty_log_set_level((enum ty_log_level)s.cfg.log_level);
    ty_log_set_format((enum ty_log_format)s.cfg.log_format);
    signal(SIGPIPE, SIG_IGN); /* a peer gone mid-write is an error code, not a death */
    uv_loop_t *loop = uv_default_loop();
    int ret = 1;
    if (start(&s, loop) || ty_daemon_start(s.d, loop))
        goto out;
    uv_run(loop, UV_RUN_DEFAULT);
    ret = 0;
out:
    if (s.cluster)
        ty_conductor_close(s.cluster, NULL, NULL); /* its events go out before the API closes */
    s.cluster = NULL;
    if (s.api)
        ty_api_close(s.api, NULL, NULL);
    s.api = NULL;
    ty_daemon_free(s.d);
    uv_run(loop, UV_RUN_DEFAULT);
    ty_metrics_registry_free(s.reg);
    ty_model_free(s.model);
    return ret;
}
