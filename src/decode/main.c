/* tycho-decode: a decode node. The node runtime (tycho/node.h: settings, engine, transfer
 * engine, KV pool client, agent, shutdown) around the decode server (tycho/decode_node.h): it
 * serves DecodeAssign (each request's one call, also its token stream) and Cancel on its RPC
 * port, receives each request's KV from its prefill node, runs continuous batching, streams
 * the tokens to the Conductor, and reports its load and its step timings. */
#include "tycho/decode_node.h"
#include "tycho/node.h"
#include "tycho.pb-c.h"

static void shape(const struct ty_node_config *cfg, struct ty_node_shape *out)
{
    *out = (struct ty_node_shape){.max_seqs = cfg->max_batch_size,
                                  .max_batch_tokens = cfg->max_batch_size,
                                  .max_batch = cfg->max_batch_size};
}

static int start(const struct ty_node_runtime *rt, void **server, uint16_t *rpc_port)
{
    struct ty_decode_node_opts no = {
        .loop = rt->loop, .engine = rt->engine, .xfer = rt->xfer, .node_id = rt->name,
        .rpc_host = rt->cfg->listen_host, .rpc_port = rt->cfg->listen_port,
        .max_running = rt->cfg->max_batch_size,
        .kv_wait_timeout_ms = (uint32_t)(rt->cfg->kv_wait_timeout_ns / 1000000),
        .timings = rt->timings, .kvstore = rt->kvstore,
        .metrics = rt->metrics, .auth = rt->auth};
    ty_decode_node_t *n;
    int rc = ty_decode_node_new(&n, &no);
    if (rc)
        return rc;
    *server = n;
    *rpc_port = ty_decode_node_rpc_port(n);
    return 0;
}

static void stop(void *server, const struct ty_node_runtime *rt)
{
    (void)rt;
    ty_decode_node_close(server, NULL, NULL);
}

int main(int argc, char **argv)
{
    static const struct ty_node_role role = {
        .daemon = "tycho-decode", .name = "decode",
        .summary = "a decode node: receives KV, continuous batching, streams tokens to the "
                   "Conductor",
        .pb_role = TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE, .shape = shape, .start = start,
        .load = ty_decode_node_load, .stop = stop};
    return ty_node_main(&role, argc, argv);
}
