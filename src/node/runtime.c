/* A node daemon's life (tycho/node.h), the same for tycho-prefill and tycho-decode: settings,
 * the model and the engine, the transfer engine with the KV pages registered, the cluster KV
 * pool's client, the role's server, the agent, the port file; then the loop until a drain, and
 * the shutdown in the reverse order. */
#include "tycho/node.h"

#include "tycho/daemon.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/node_kvstore.h"
#include "tycho.pb-c.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

struct node {
    const struct ty_node_role *role;
    struct ty_node_config cfg;
    struct ty_auth auth;
    struct ty_node_runtime rt;
    ty_daemon_t *d;
    ty_model_t *model;
    ty_node_agent_t *agent;
    void *server; /* the role's */
    uint16_t rpc_port;
    char name[128];
    char kv_device[32];        /* "cpu:0", "cuda:N": where the KV pages live */
    uint32_t n_registered;     /* layers whose pages register_pages registered */
    const char *xports[3];     /* the handoff paths told to the Conductor */
    size_t n_xports;
    int exit_code;             /* 2: a setting cannot work here; else 1 on a failed start */
};

static void on_drain(ty_daemon_t *d, void *arg)
{
    (void)arg;
    ty_daemon_stop(d);
}

/* The page cache's block_cb: on the worker thread, inside the engine's calls. */
static void on_kv_block(void *arg, uint64_t hash, bool stored)
{
    ty_kv_events_note(arg, hash, stored);
}

/* KV pages in shared memory from the transfer engine (memfd, registered as they are made), so
 * that a peer on this host writes them through the local transport. */
static void *shm_alloc(void *ctx, size_t bytes)
{
    void *p = NULL;
    return ty_xfer_mem_alloc(ctx, bytes, &p) == 0 ? p : NULL;
}

static void shm_free(void *ctx, void *ptr)
{
    ty_xfer_mem_release(ctx, ptr);
}

/* The transfer engine, before the KV pages: where they come from depends on it. Transport
 * rdma without a device is a setting that cannot work here: exit 2 naming it. */
static int start_transfer(struct node *s)
{
    const struct ty_node_transfer_config *t = &s->cfg.transfer;
    const char *xport = ty_node_transport_names[t->transport];
    struct ty_xfer_engine_opts xo = {.listen_host = s->cfg.listen_host,
                                     .listen_port = s->cfg.transfer_port, .transport = xport,
                                     .rdma_devices = t->rdma_devices, .auth = s->rt.auth};
    int rc = ty_xfer_engine_new(&s->rt.xfer, &xo);
    if (rc == TY_ENODEV) {
        fprintf(stderr, "%s: transfer.transport: rdma, but no RDMA device is usable here "
                "(transfer.rdma_devices: %s); use auto or tcp\n", s->role->daemon,
                t->rdma_devices ? t->rdma_devices : "any with an active port");
        s->exit_code = 2;
    } else if (rc) {
        fprintf(stderr, "%s: transfer engine on %s:%u: %s\n", s->role->daemon,
                s->cfg.listen_host, s->cfg.transfer_port, ty_strerror(rc));
    }
    s->n_xports = 0;
    if (!strcmp(xport, "auto") || !strcmp(xport, "local")) /* device pages: by CUDA IPC */
        s->xports[s->n_xports++] =
            !strcmp(ty_engine_backend_names[s->cfg.backend], "cuda") ? "cuda_ipc" : "local";
    if (!strcmp(xport, "auto") || !strcmp(xport, "tcp"))
        s->xports[s->n_xports++] = "tcp";
    if (!strcmp(xport, "rdma") || (!strcmp(xport, "auto") && ty_xfer_rdma_available()))
        s->xports[s->n_xports++] = "rdma";
    return rc;
}

/* Each layer's K and V array of the pool registered with the transfer engine where the pool
 * did not take them from it (device memory, or host memory with transport tcp/rdma). */
static int register_pages(struct node *s)
{
    ty_kvpool_t *pool = ty_engine_pool(s->rt.engine);
    size_t len = ty_kvpool_page_bytes(pool) * ty_kvpool_pages_total(pool);
    uint32_t n_layers = ty_model_config(s->model)->n_layers;
    for (uint32_t l = 0; l < n_layers; l++) {
        int rc = ty_xfer_mem_register(s->rt.xfer, ty_kvpool_k(pool, l, 0), len, s->kv_device);
        if (!rc)
            rc = ty_xfer_mem_register(s->rt.xfer, ty_kvpool_v(pool, l, 0), len, s->kv_device);
        if (rc) {
            fprintf(stderr, "%s: registering KV layer %u (%s) with the transfer engine: %s\n",
                    s->role->daemon, l, s->kv_device, ty_strerror(rc));
            return rc;
        }
        s->n_registered = l + 1;
    }
    return 0;
}

static void unregister_pages(struct node *s)
{
    ty_kvpool_t *pool = ty_engine_pool(s->rt.engine);
    for (uint32_t l = 0; l < s->n_registered; l++) { /* waits for peers' accesses in progress */
        ty_xfer_mem_unregister(s->rt.xfer, ty_kvpool_k(pool, l, 0));
        ty_xfer_mem_unregister(s->rt.xfer, ty_kvpool_v(pool, l, 0));
    }
    s->n_registered = 0;
}

static int start_engine(struct node *s, const struct ty_node_shape *sh)
{
    const char *daemon = s->role->daemon;
    const char *backend = ty_engine_backend_names[s->cfg.backend];
    char err[512] = "";
    int rc = ty_model_load(&s->model, s->cfg.model_path, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "%s: cannot load model %s: %s\n", daemon, s->cfg.model_path, err);
        return rc;
    }
    bool cuda = !strcmp(backend, "cuda");
    const char *xport = ty_node_transport_names[s->cfg.transfer.transport];
    struct ty_kvpool_storage shm = {.ctx = s->rt.xfer, .alloc = shm_alloc, .free = shm_free,
                                    .name = "shared memory", .host = true};
    struct ty_engine_opts eo = {.n_threads = s->cfg.threads,
                                .kv_block_tokens = s->cfg.kv_block_tokens,
                                .kv_pages = s->cfg.kv_pages, .kv_bytes = s->cfg.kv_cache_memory,
                                .kv_dtype = ty_engine_kv_dtype_names[s->cfg.kv_cache_dtype],
                                .max_seqs = sh->max_seqs, .max_ctx = s->cfg.max_ctx,
                                .max_batch_tokens = sh->max_batch_tokens, .backend = backend,
                                .cuda_device = (int)s->cfg.cuda_device,
                                .cuda_weights = ty_engine_cuda_weights_names[s->cfg.cuda_weights]};
    /* pages a same-host peer can reach: the local transport is what auto picks then */
    bool shared = !cuda && (!strcmp(xport, "auto") || !strcmp(xport, "local"));
    if (shared)
        eo.kv_host_storage = &shm;
    if (s->rt.kv_events) {
        eo.kv_block_cb = on_kv_block;
        eo.kv_block_arg = s->rt.kv_events;
    }
    if (cuda)
        snprintf(s->kv_device, sizeof(s->kv_device), "cuda:%u", s->cfg.cuda_device);
    else
        snprintf(s->kv_device, sizeof(s->kv_device), "cpu:0");
    rc = ty_engine_new(&s->rt.engine, s->model, &eo);
    if (rc == TY_ENOTSUP && cuda) {
        fprintf(stderr, "%s: backend: cuda, but this build has no CUDA backend (rebuild with "
                "the CUDA toolkit) \n", daemon);
        s->exit_code = 2;
    } else if (rc == TY_ENODEV && cuda) {
        fprintf(stderr, "%s: cuda_device: %u: no such usable CUDA device here\n", daemon,
                s->cfg.cuda_device);
        s->exit_code = 2;
    } else if (rc) {
        fprintf(stderr, "%s: engine (%s backend): %s\n", daemon, backend, ty_strerror(rc));
    }
    if (rc)
        return rc;
    return shared ? 0 : register_pages(s);
}

/* The KV pool's client: its own transfer engine on our listen address (the pool reaches
 * nothing else of ours). An unreachable master is not an error here: requests then skip the
 * pool until it answers. */
static int start_pool(struct node *s)
{
    int rc = ty_node_kvstore_client_new(&s->cfg.kv_pool, s->cfg.listen_host, s->rt.auth,
                                        &s->rt.store);
    if (!rc && s->rt.store) {
        ty_kvpool_t *pool = ty_engine_pool(s->rt.engine);
        struct ty_node_kvstore_opts ko = {
            .client = s->rt.store, .pool = pool,
            .n_layers = ty_model_config(s->model)->n_layers,
            .hash_seed = ty_kvpool_hash_seed(pool),
            .retry_ms = (uint32_t)(s->cfg.kv_pool.retry_ns / 1000000)};
        rc = ty_node_kvstore_new(&s->rt.kvstore, &ko);
    }
    if (rc)
        fprintf(stderr, "%s: KV pool client (master %s): %s\n", s->role->daemon,
                s->cfg.kv_pool.master, ty_strerror(rc));
    return rc;
}

static int start_node(struct node *s, const struct ty_node_shape *sh)
{
    const struct ty_node_role *r = s->role;
    if (s->cfg.name)
        snprintf(s->name, sizeof(s->name), "%s", s->cfg.name);
    else
        ty_node_default_name(r->name, s->name, sizeof(s->name));
    ty_kvpool_t *pool = ty_engine_pool(s->rt.engine);
    const char *backend = ty_engine_backend_names[s->cfg.backend];
    const char *xport = ty_node_transport_names[s->cfg.transfer.transport];
    struct ty_node_metrics_opts mo = {
        .loop = s->rt.loop, .host = s->cfg.listen_host, .port = s->cfg.metrics_port,
        .role = r->name, .backend = backend, .device = s->kv_device, .transport = xport,
        .pages_total = ty_kvpool_pages_total(pool), .xfer = s->rt.xfer};
    int rc;
    if ((rc = ty_node_metrics_new(&s->rt.metrics, &mo))) {
        fprintf(stderr, "%s: metrics on %s:%u: %s\n", r->daemon, s->cfg.listen_host,
                s->cfg.metrics_port, ty_strerror(rc));
        return rc;
    }
    /* before the role's worker starts: it pushes the samples */
    ty_timing_ring_observe(s->rt.timings, ty_node_metrics_step, s->rt.metrics);
    rc = r->start(&s->rt, &s->server, &s->rpc_port);
    if (rc) {
        fprintf(stderr, "%s: cannot listen on %s:%u: %s\n", r->daemon, s->cfg.listen_host,
                s->cfg.listen_port, ty_strerror(rc));
        return rc;
    }
    ty_node_metrics_set_load(s->rt.metrics, r->load, s->server);
    char addr[300];
    snprintf(addr, sizeof(addr), "%s:%u", s->cfg.listen_host, s->rpc_port);
    struct ty_node_agent_opts ao = {
        .loop = s->rt.loop, .auth = s->rt.auth, .role = r->pb_role,
        .conductor_address = s->cfg.conductor_address,
        .node_id = s->name, .address = addr, .segment = ty_xfer_engine_name(s->rt.xfer),
        .model = s->model, .model_path = s->cfg.model_path,
        .kv_pages = ty_kvpool_pages_total(pool), .block_tokens = ty_kvpool_block_tokens(pool),
        .max_batch = sh->max_batch, .max_batch_prompts = sh->max_batch_prompts,
        .max_ctx = ty_engine_max_ctx(s->rt.engine), .interleaves = sh->interleaves,
        .kv_dtype = ty_kv_dtype_name(ty_kvpool_dtype(pool)),
        .heartbeat_interval_ms = (uint32_t)(s->cfg.heartbeat_interval_ns / 1000000),
        .load_cb = r->load, .load_arg = s->server, .progress_cb = r->progress,
        .kv_events = s->rt.kv_events,
        .timings = s->rt.timings, .backend = backend, .kv_device = s->kv_device,
        .transports = s->xports, .n_transports = s->n_xports};
    if ((rc = ty_node_agent_new(&s->agent, &ao)))
        return rc;
    ty_node_metrics_set_agent(s->rt.metrics, s->agent);
    TY_LOG_INFO(r->name, "%s: RPC %s, transfer segment %s (transport %s), metrics :%u, %s on "
                "%s (KV pages on %s), KV pool %s", s->name, addr,
                ty_xfer_engine_name(s->rt.xfer), xport, ty_node_metrics_port(s->rt.metrics),
                ty_model_desc(s->model), backend, s->kv_device,
                s->rt.store ? s->cfg.kv_pool.master : "none");
    return ty_node_write_ports(s->cfg.port_file, s->rpc_port, ty_xfer_engine_port(s->rt.xfer),
                               ty_node_metrics_port(s->rt.metrics));
}

bool ty_node_engine_alive(const ty_engine_t *e, uint64_t stall_ns, char *why, size_t cap)
{
    uint64_t busy = e ? ty_engine_busy_ns(e) : 0;
    if (busy < stall_ns)
        return true;
    snprintf(why, cap, "the engine's forward call has run %.1f s (engine_stall_timeout %.1f s)",
             (double)busy / 1e9, (double)stall_ns / 1e9);
    return false;
}

static void on_muted_cancel(ty_rpc_call_t *call, int reason, void *arg)
{
    (void)arg;
    ty_rpc_call_fail(call, reason, "cancelled");
}

bool ty_node_test_mute(ty_rpc_call_t *call, const char *what)
{
    const char *path = getenv("TYCHO_TEST_MUTE_FILE");
    if (!path || access(path, F_OK) != 0)
        return false;
    TY_LOG_WARN("node", "test hook TYCHO_TEST_MUTE_FILE: a %s is left unanswered", what);
    ty_rpc_call_set_cancel_cb(call, on_muted_cancel, NULL);
    return true;
}

static bool node_alive(void *arg, char *why, size_t cap)
{
    struct node *s = arg;
    return ty_node_engine_alive(s->rt.engine, s->cfg.engine_stall_ns, why, cap);
}

int ty_node_main(const struct ty_node_role *role, int argc, char **argv)
{
    static struct node s;
    s.role = role;
    int code = 0;
    struct ty_daemon_opts o = {.name = role->daemon, .summary = role->summary,
                               .table = &ty_node_config_table, .config = &s.cfg,
                               .drain = on_drain, .alive = node_alive, .arg = &s,
                               .auth = &s.auth};
    if (ty_daemon_new(&s.d, &o, argc, argv, &code) != 0)
        return code;
    ty_log_set_level((enum ty_log_level)s.cfg.log_level);
    ty_log_set_format((enum ty_log_format)s.cfg.log_format);
    signal(SIGPIPE, SIG_IGN); /* a peer gone mid-write is an error code, not a death */
    uv_loop_t *loop = uv_default_loop();
    struct ty_node_shape sh = {0};
    role->shape(&s.cfg, &sh);
    s.rt = (struct ty_node_runtime){.cfg = &s.cfg, .loop = loop, .name = s.name,
                                    .auth = &s.auth};
    int ret = 1;
    if ((role->kv_events && ty_kv_events_new(&s.rt.kv_events, 0)) ||
        ty_timing_ring_new(&s.rt.timings, 0) || start_transfer(&s) || start_engine(&s, &sh) ||
        start_pool(&s) || start_node(&s, &sh) || ty_daemon_start(s.d, loop)) {
        ret = s.exit_code ? s.exit_code : 1;
        goto out;
    }
    uv_run(loop, UV_RUN_DEFAULT);
    ret = 0;
out:
    if (s.rt.metrics)
        ty_node_metrics_set_agent(s.rt.metrics, NULL); /* not ready from here on */
    ty_node_agent_close(s.agent, NULL, NULL);
    if (s.server)
        role->stop(s.server, &s.rt);
    ty_node_metrics_close(s.rt.metrics);
    ty_daemon_free(s.d);
    uv_run(loop, UV_RUN_DEFAULT);
    ty_node_kvstore_free(s.rt.kvstore); /* off the loop: its writer finishes what is queued */
    ty_store_client_free(s.rt.store);   /* after the node and the kvstore that used it */
    if (s.rt.engine)
        unregister_pages(&s);
    ty_engine_free(s.rt.engine); /* shared pages go back to the transfer engine */
    ty_xfer_engine_free(s.rt.xfer);
    ty_node_metrics_free(s.rt.metrics); /* every thread that reports to it has stopped */
    ty_model_free(s.model);
    ty_kv_events_free(s.rt.kv_events); /* after the pool that notes and the agent that takes */
    ty_timing_ring_free(s.rt.timings);
    return ret;
}
