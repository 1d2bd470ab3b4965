/* tycho-decode: a decode node. Loads the model, creates the engine and the transfer engine
 * (tcp), registers the KV pool's layer arrays (prefill nodes write into them), serves
 * DecodeAssign (each request's one call, also its token stream) and Cancel on its RPC port and
 * registers itself with the Conductor (heartbeats with its load and its decode step timings). */
#include "tycho/cluster.h"
#include "tycho/daemon.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/decode_node.h"
#include "tycho/node_kvstore.h"
#include "tycho.pb-c.h"

#include <signal.h>
#include <stdio.h>

struct node {
    struct ty_cluster_node_config cfg;
    ty_daemon_t *d;
    ty_model_t *model;
    ty_engine_t *engine;
    ty_xfer_engine_t *xfer;
    ty_store_client_t *store; /* the cluster KV pool, when configured */
    ty_decode_node_t *node;
    ty_cluster_agent_t *agent;
    ty_timing_ring_t *timings;
    char name[128];
};

static void on_drain(ty_daemon_t *d, void *arg)
{
    (void)arg;
    ty_daemon_stop(d);
}

static int start_engine(struct node *s)
{
    char err[512] = "";
    int rc = ty_model_load(&s->model, s->cfg.model_path, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "tycho-decode: cannot load model %s: %s\n", s->cfg.model_path, err);
        return rc;
    }
    struct ty_engine_opts eo = {.n_threads = s->cfg.threads,
                                .kv_block_tokens = s->cfg.kv_block_tokens,
                                .kv_pages = s->cfg.kv_pages, .kv_bytes = s->cfg.kv_cache_memory,
                                .kv_dtype = ty_cluster_kv_dtype_names[s->cfg.kv_cache_dtype],
                                .max_seqs = s->cfg.max_batch_size,
                                .max_ctx = s->cfg.max_ctx,
                                .max_batch_tokens = s->cfg.max_batch_size};
    if ((rc = ty_engine_new(&s->engine, s->model, &eo))) {
        fprintf(stderr, "tycho-decode: engine: %s\n", ty_strerror(rc));
        return rc;
    }
    struct ty_xfer_engine_opts xo = {.listen_host = s->cfg.listen_host,
                                     .listen_port = s->cfg.transfer_port, .transport = "tcp",
                                     .rdma_devices = "none"};
    if ((rc = ty_xfer_engine_new(&s->xfer, &xo))) {
        fprintf(stderr, "tycho-decode: transfer engine: %s\n", ty_strerror(rc));
        return rc;
    }
    return ty_cluster_kv_register(s->xfer, ty_engine_pool(s->engine),
                                  ty_model_config(s->model)->n_layers);
}

static int start_pool(struct node *s)
{
    int rc = ty_node_kvstore_client_new(&s->cfg.kv_pool, s->cfg.listen_host, &s->store);
    if (rc)
        fprintf(stderr, "tycho-decode: KV pool client (master %s): %s\n", s->cfg.kv_pool.master,
                ty_strerror(rc));
    return rc;
}

static int start_node(struct node *s, uv_loop_t *loop)
{
    if (s->cfg.name)
        snprintf(s->name, sizeof(s->name), "%s", s->cfg.name);
    else
        ty_cluster_default_name("decode", s->name, sizeof(s->name));
    struct ty_decode_node_opts no = {
        .loop = loop, .engine = s->engine, .xfer = s->xfer, .node_id = s->name,
        .rpc_host = s->cfg.listen_host, .rpc_port = s->cfg.listen_port,
        .max_running = s->cfg.max_batch_size,
        .kv_wait_timeout_ms = (uint32_t)(s->cfg.kv_wait_timeout_ns / 1000000),
        .timings = s->timings, .store = s->store,
        .store_retry_ms = (uint32_t)(s->cfg.kv_pool.retry_ns / 1000000)};
    int rc = ty_decode_node_new(&s->node, &no);
    if (rc) {
        fprintf(stderr, "tycho-decode: cannot listen on %s:%u: %s\n", s->cfg.listen_host,
                s->cfg.listen_port, ty_strerror(rc));
        return rc;
    }
    char addr[300];
    snprintf(addr, sizeof(addr), "%s:%u", s->cfg.listen_host, ty_decode_node_rpc_port(s->node));
    ty_kvpool_t *pool = ty_engine_pool(s->engine);
    struct ty_cluster_agent_opts ao = {
        .loop = loop, .conductor_address = s->cfg.conductor_address,
        .role = TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE, .node_id = s->name, .address = addr,
        .segment = ty_xfer_engine_name(s->xfer), .model = s->model,
        .model_path = s->cfg.model_path, .kv_pages = ty_kvpool_pages_total(pool),
        .block_tokens = ty_kvpool_block_tokens(pool), .max_batch = s->cfg.max_batch_size,
        .max_ctx = ty_engine_max_ctx(s->engine), .kv_dtype = ty_kv_dtype_name(ty_kvpool_dtype(pool)),
        .heartbeat_interval_ms = (uint32_t)(s->cfg.heartbeat_interval_ns / 1000000),
        .load_cb = ty_decode_node_load, .load_arg = s->node, .timings = s->timings};
    if ((rc = ty_cluster_agent_new(&s->agent, &ao)))
        return rc;
    TY_LOG_INFO("decode", "%s: RPC %s, transfer segment %s (tcp), %s, KV pool %s", s->name,
                addr, ty_xfer_engine_name(s->xfer), ty_model_desc(s->model),
                s->store ? s->cfg.kv_pool.master : "none");
    return ty_cluster_write_ports(s->cfg.port_file, ty_decode_node_rpc_port(s->node),
                                  ty_xfer_engine_port(s->xfer));
}

int main(int argc, char **argv)
{
    static struct node s;
    int code = 0;
    struct ty_daemon_opts o = {.name = "tycho-decode",
                               .summary = "a decode node: receives KV, continuous batching, "
                                          "streams tokens to the Conductor",
                               .table = &ty_cluster_node_config_table, .config = &s.cfg,
                               .drain = on_drain, .arg = &s};
    if (ty_daemon_new(&s.d, &o, argc, argv, &code) != 0)
        return code;
    ty_log_set_level((enum ty_log_level)s.cfg.log_level);
    signal(SIGPIPE, SIG_IGN); /* a peer gone mid-write is an error code, not a death */
    uv_loop_t *loop = uv_default_loop();
    int ret = 1;
    if (ty_timing_ring_new(&s.timings, 0) || start_engine(&s) || start_pool(&s) ||
        start_node(&s, loop) || ty_daemon_start(s.d, loop))
        goto out;
    uv_run(loop, UV_RUN_DEFAULT);
    ret = 0;
out:
    ty_cluster_agent_close(s.agent, NULL, NULL);
    if (s.node)
        ty_decode_node_close(s.node, NULL, NULL);
    ty_daemon_free(s.d);
    uv_run(loop, UV_RUN_DEFAULT);
    ty_store_client_free(s.store); /* after the node that used it */
    ty_xfer_engine_free(s.xfer);
    ty_engine_free(s.engine);
    ty_model_free(s.model);
    ty_timing_ring_free(s.timings);
    return ret;
}
