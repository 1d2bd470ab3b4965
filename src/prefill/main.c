/* tycho-prefill: a prefill node. Loads the model, creates the engine and the transfer engine
 * (tcp), registers the page pool's layer arrays, connects to the cluster KV pool when
 * kv_pool.master is set, serves PrefillAssign on its RPC port and registers itself with the
 * Conductor (heartbeats with its load, its prefill timings and the KV block events of its page
 * cache). */
#include "tycho/node.h"
#include "tycho/daemon.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/node_kvstore.h"
#include "tycho/prefill.h"
#include "tycho.pb-c.h"

#include <signal.h>
#include <stdio.h>

struct node {
    struct ty_node_config cfg;
    ty_daemon_t *d;
    ty_model_t *model;
    ty_engine_t *engine;
    ty_xfer_engine_t *xfer;
    ty_store_client_t *store; /* the cluster KV pool, when configured */
    ty_prefill_t *prefill;
    ty_node_agent_t *agent;
    ty_kv_events_t *kv_events; /* the pool's prefix index, for the Conductor */
    ty_timing_ring_t *timings;
    char name[128];
};

static void on_drain(ty_daemon_t *d, void *arg)
{
    (void)arg;
    ty_daemon_stop(d);
}

/* The pool's block_cb: on the worker thread, inside the engine's calls. */
static void on_kv_block(void *arg, uint64_t hash, bool stored)
{
    ty_kv_events_note(arg, hash, stored);
}

static int start_engine(struct node *s)
{
    char err[512] = "";
    int rc = ty_model_load(&s->model, s->cfg.model_path, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "tycho-prefill: cannot load model %s: %s\n", s->cfg.model_path, err);
        return rc;
    }
    struct ty_engine_opts eo = {.n_threads = s->cfg.threads,
                                .kv_block_tokens = s->cfg.kv_block_tokens,
                                .kv_pages = s->cfg.kv_pages, .kv_bytes = s->cfg.kv_cache_memory,
                                .max_seqs = 4,
                                .kv_dtype = ty_engine_kv_dtype_names[s->cfg.kv_cache_dtype],
                                .max_ctx = s->cfg.max_ctx,
                                .max_batch_tokens = s->cfg.chunk_tokens,
                                .kv_block_cb = on_kv_block, .kv_block_arg = s->kv_events};
    if ((rc = ty_engine_new(&s->engine, s->model, &eo))) {
        fprintf(stderr, "tycho-prefill: engine: %s\n", ty_strerror(rc));
        return rc;
    }
    struct ty_xfer_engine_opts xo = {.listen_host = s->cfg.listen_host,
                                     .listen_port = s->cfg.transfer_port, .transport = "tcp",
                                     .rdma_devices = "none"};
    if ((rc = ty_xfer_engine_new(&s->xfer, &xo))) {
        fprintf(stderr, "tycho-prefill: transfer engine: %s\n", ty_strerror(rc));
        return rc;
    }
    return ty_node_kv_register(s->xfer, ty_engine_pool(s->engine),
                                  ty_model_config(s->model)->n_layers);
}

/* The KV pool's client: its own transfer engine on our listen address (the pool reaches
 * nothing else of ours). An unreachable master is not an error here: prompts then skip the
 * pool until it answers. */
static int start_pool(struct node *s)
{
    int rc = ty_node_kvstore_client_new(&s->cfg.kv_pool, s->cfg.listen_host, &s->store);
    if (rc)
        fprintf(stderr, "tycho-prefill: KV pool client (master %s): %s\n", s->cfg.kv_pool.master,
                ty_strerror(rc));
    return rc;
}

static int start_node(struct node *s, uv_loop_t *loop)
{
    struct ty_prefill_opts po = {.loop = loop, .engine = s->engine, .xfer = s->xfer,
                                 .rpc_host = s->cfg.listen_host,
                                 .rpc_port = s->cfg.listen_port, .timings = s->timings,
                                 .max_batch = s->cfg.prefill_batch,
                                 .store = s->store,
                                 .store_retry_ms = (uint32_t)(s->cfg.kv_pool.retry_ns / 1000000)};
    int rc = ty_prefill_new(&s->prefill, &po);
    if (rc) {
        fprintf(stderr, "tycho-prefill: cannot listen on %s:%u: %s\n", s->cfg.listen_host,
                s->cfg.listen_port, ty_strerror(rc));
        return rc;
    }
    char addr[300];
    snprintf(addr, sizeof(addr), "%s:%u", s->cfg.listen_host, ty_prefill_rpc_port(s->prefill));
    if (s->cfg.name)
        snprintf(s->name, sizeof(s->name), "%s", s->cfg.name);
    else
        ty_node_default_name("prefill", s->name, sizeof(s->name));
    ty_kvpool_t *pool = ty_engine_pool(s->engine);
    struct ty_node_agent_opts ao = {
        .loop = loop, .conductor_address = s->cfg.conductor_address,
        .role = TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, .node_id = s->name, .address = addr,
        .segment = ty_xfer_engine_name(s->xfer), .model = s->model,
        .model_path = s->cfg.model_path, .kv_pages = ty_kvpool_pages_total(pool),
        .block_tokens = ty_kvpool_block_tokens(pool), .max_batch = s->cfg.chunk_tokens,
        .max_batch_prompts = s->cfg.prefill_batch, .max_ctx = ty_engine_max_ctx(s->engine),
        .interleaves = s->cfg.prefill_batch > 1, /* short prompts join a long one's chunks */
        .kv_dtype = ty_kv_dtype_name(ty_kvpool_dtype(pool)),
        .heartbeat_interval_ms = (uint32_t)(s->cfg.heartbeat_interval_ns / 1000000),
        .load_cb = ty_prefill_load, .load_arg = s->prefill, .kv_events = s->kv_events,
        .timings = s->timings};
    if ((rc = ty_node_agent_new(&s->agent, &ao)))
        return rc;
    TY_LOG_INFO("prefill", "%s: RPC %s, transfer segment %s (tcp), %s, KV pool %s", s->name,
                addr, ty_xfer_engine_name(s->xfer), ty_model_desc(s->model),
                s->store ? s->cfg.kv_pool.master : "none");
    return ty_node_write_ports(s->cfg.port_file, ty_prefill_rpc_port(s->prefill),
                                  ty_xfer_engine_port(s->xfer));
}

int main(int argc, char **argv)
{
    static struct node s;
    int code = 0;
    struct ty_daemon_opts o = {.name = "tycho-prefill",
                               .summary = "a prefill node: chunked prefill, KV streamed to the "
                                          "decode node layer by layer",
                               .table = &ty_node_config_table, .config = &s.cfg,
                               .drain = on_drain, .arg = &s};
    if (ty_daemon_new(&s.d, &o, argc, argv, &code) != 0)
        return code;
    ty_log_set_level((enum ty_log_level)s.cfg.log_level);
    signal(SIGPIPE, SIG_IGN); /* a peer gone mid-write is an error code, not a death */
    uv_loop_t *loop = uv_default_loop();
    int ret = 1;
    if (ty_kv_events_new(&s.kv_events, 0) || ty_timing_ring_new(&s.timings, 0) ||
        start_engine(&s) || start_pool(&s) || start_node(&s, loop) ||
        ty_daemon_start(s.d, loop))
        goto out;
    uv_run(loop, UV_RUN_DEFAULT);
    ret = 0;
out:
    ty_node_agent_close(s.agent, NULL, NULL);
    if (s.prefill) {
        struct ty_prefill_stats st;
        ty_prefill_stats(s.prefill, &st);
        if (s.store)
            TY_LOG_INFO("prefill", "KV pool: %llu lookups, %llu blocks read, %llu written, %llu "
                        "not written, %llu errors, %llu prompts skipped it",
                        (unsigned long long)st.pool_lookups,
                        (unsigned long long)st.pool_hit_blocks,
                        (unsigned long long)st.pool_stored_blocks,
                        (unsigned long long)st.pool_dropped, (unsigned long long)st.pool_errors,
                        (unsigned long long)st.pool_skipped);
        ty_prefill_close(s.prefill, NULL, NULL);
    }
    ty_daemon_free(s.d);
    uv_run(loop, UV_RUN_DEFAULT);
    ty_store_client_free(s.store); /* after the node that used it */
    ty_xfer_engine_free(s.xfer);
    ty_engine_free(s.engine);
    ty_model_free(s.model);
    ty_kv_events_free(s.kv_events); /* after the pool that notes and the agent that takes */
    ty_timing_ring_free(s.timings);
    return ret;
}
