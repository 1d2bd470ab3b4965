/* tycho-prefill: a prefill node. The node runtime (tycho/node.h: settings, engine, transfer
 * engine, KV pool client, agent, shutdown) around the prefill server (tycho/prefill.h): it
 * serves PrefillAssign on its RPC port, streams each prompt's KV to its decode node layer by
 * layer, and reports its load, its prefill timings and the KV block events of its page cache
 * to the Conductor. */
#include "tycho/log.h"
#include "tycho/node.h"
#include "tycho/prefill.h"
#include "tycho.pb-c.h"

static void shape(const struct ty_node_config *cfg, struct ty_node_shape *out)
{
    *out = (struct ty_node_shape){.max_seqs = 4, .max_batch_tokens = cfg->chunk_tokens,
                                  .max_batch = cfg->chunk_tokens,
                                  .max_batch_prompts = cfg->prefill_batch,
                                  /* short prompts join a long one's chunks */
                                  .interleaves = cfg->prefill_batch > 1};
}

static int start(const struct ty_node_runtime *rt, void **server, uint16_t *rpc_port)
{
    struct ty_prefill_opts po = {
        .loop = rt->loop, .engine = rt->engine, .xfer = rt->xfer, .rpc_host = rt->cfg->listen_host,
        .rpc_port = rt->cfg->listen_port, .timings = rt->timings,
        .max_batch = rt->cfg->prefill_batch, .kvstore = rt->kvstore,
        .metrics = rt->metrics, .auth = rt->auth,
        .peer_timeout_ms = (uint32_t)(rt->cfg->peer_fetch_timeout_ns / 1000000)};
    ty_prefill_t *p;
    int rc = ty_prefill_new(&p, &po);
    if (rc)
        return rc;
    *server = p;
    *rpc_port = ty_prefill_rpc_port(p);
    return 0;
}

static void stop(void *server, const struct ty_node_runtime *rt)
{
    struct ty_prefill_stats st;
    ty_prefill_stats(server, &st);
    if (rt->store)
        TY_LOG_INFO("prefill", "KV pool: %llu lookups, %llu blocks read, %llu written, %llu "
                    "not written, %llu errors, %llu prompts skipped it",
                    (unsigned long long)st.pool_lookups, (unsigned long long)st.pool_hit_blocks,
                    (unsigned long long)st.pool_stored_blocks,
                    (unsigned long long)st.pool_dropped, (unsigned long long)st.pool_errors,
                    (unsigned long long)st.pool_skipped);
    if (st.peer_read_blocks || st.peer_failed_blocks || st.pins_taken || st.pins_refused)
        TY_LOG_INFO("prefill", "peer reads: %llu blocks read, %llu failed; pins for peers: "
                    "%llu taken, %llu refused", (unsigned long long)st.peer_read_blocks,
                    (unsigned long long)st.peer_failed_blocks,
                    (unsigned long long)st.pins_taken, (unsigned long long)st.pins_refused);
    ty_prefill_close(server, NULL, NULL);
}

int main(int argc, char **argv)
{
    static const struct ty_node_role role = {
        .daemon = "tycho-prefill", .name = "prefill",
        .summary = "a prefill node: chunked prefill, KV streamed to the decode node layer by layer",
        .pb_role = TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, .kv_events = true, .shape = shape,
        .start = start, .load = ty_prefill_load,
        .progress = ty_prefill_progress, .stop = stop};
    return ty_node_main(&role, argc, argv);
}
