/* A node daemon's Prometheus metrics (tycho/node.h): the registry, the families the prefill and
 * decode nodes fill, and the HTTP port that serves them (/metrics, /health, /ready). Updates
 * come from any thread (lock-free children, all looked up at start); the load
 * gauges are read from the role's load callback when a scrape arrives, on the loop thread. */
#include "tycho/auth.h"
#include "tycho/node.h"

#include "tycho/errors.h"
#include "tycho/http.h"
#include "tycho/log.h"
#include "tycho/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_XPORT 4 /* tcp, local, rdma, cuda_ipc: the transports a KV handoff can take */

struct ty_node_metrics {
    ty_metrics_registry_t *reg;
    ty_http_server_t *http;
    ty_node_load_cb load;
    void *load_arg;
    const ty_node_agent_t *agent; /* /ready: registered with the Conductor */
    uint64_t pages_total;
    /* [received][transport]: bytes, handoffs, latency; made at start, the only ones counted */
    ty_metrics_child_t *kv_bytes[2][N_XPORT], *kv_handoffs[2][N_XPORT], *kv_seconds[2][N_XPORT];
    ty_metrics_child_t *pages_used, *pages_free, *running, *queued, *preempted;
    ty_metrics_child_t *step_seconds, *batch_size, *step_tokens;
    ty_metrics_child_t *auth_failures; /* the process's failed cluster handshakes */
    uint64_t auth_seen;
    ty_xfer_engine_t *xfer;
    ty_metrics_child_t *fenced, *refused_conns; /* the transfer engine's (on scrape) */
    /* prefill: prefix blocks read from other prefill nodes' caches ([transport] bytes, blocks
     * read and failed), and pins of our blocks for peers' reads (blocks pinned, refused) */
    ty_metrics_child_t *peer_bytes[N_XPORT], *peer_blocks[2], *peer_pins[2];
    uint64_t fenced_seen, refused_conns_seen;
};

static const char *const xports[N_XPORT] = {"tcp", "local", "rdma", "cuda_ipc"};

/* Handoff latency: from the first layer's writes to the last one landed (tens of microseconds
 * in shared memory, up to seconds for a long prompt over a slow link). */
static const double kv_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                    0.025,  0.05,    0.1,    0.25,  0.5,    1.0,   2.5, 5.0};
static const double step_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                      0.1,    0.25,  0.5,    1.0,   2.5,  5.0,   10.0};
static const double batch_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

static int child(ty_metrics_family_t *f, const char *v0, const char *v1,
                 ty_metrics_child_t **out)
{
    const char *v[] = {v0, v1};
    return ty_metrics_child_get(f, v0 ? v : NULL, out);
}

static void on_http(void *arg, ty_http_req_t *req)
{
    ty_node_metrics_t *m = arg;
    const char *path = ty_http_req_path(req);
    if (strcmp(ty_http_req_method(req), "GET") != 0) {
        ty_http_respond(req, 405, "text/plain", "Allow: GET\r\n", "GET only\n", 9);
        return;
    }
    if (!strcmp(path, "/health")) {
        ty_http_respond(req, 200, "text/plain", NULL, "ok\n", 3);
        return;
    }
    if (!strcmp(path, "/ready")) {
        if (m->agent && ty_node_agent_registered(m->agent))
            ty_http_respond(req, 200, "text/plain", NULL, "ready\n", 6);
        else
            ty_http_respond(req, 503, "text/plain", NULL, "not registered with the Conductor\n",
                            34);
        return;
    }
    if (strcmp(path, "/metrics") != 0) {
        ty_http_respond(req, 404, "text/plain", NULL, "not found (/metrics, /health, /ready)\n",
                        38);
        return;
    }
    if (m->load) {
        struct ty_node_load l = {0};
        m->load(m->load_arg, &l);
        ty_metrics_gauge_set(m->pages_free, (double)l.free_pages);
        ty_metrics_gauge_set(m->pages_used, (double)(m->pages_total > l.free_pages
                                                         ? m->pages_total - l.free_pages
                                                         : 0));
        ty_metrics_gauge_set(m->running, (double)l.running);
        ty_metrics_gauge_set(m->queued, (double)l.queued);
        ty_metrics_gauge_set(m->preempted, (double)l.preemptions);
    }
    uint64_t af = ty_auth_failures();
    ty_metrics_counter_follow(m->auth_failures, af, &m->auth_seen);
    if (m->xfer) {
        struct ty_xfer_stats xs;
        ty_xfer_engine_stats(m->xfer, &xs);
        ty_metrics_counter_follow(m->fenced, xs.fenced_writes, &m->fenced_seen);
        ty_metrics_counter_follow(m->refused_conns, xs.refused_conns, &m->refused_conns_seen);
    }
    char *body = NULL;
    size_t len = 0;
    if (ty_metrics_render(m->reg, &body, &len) != 0) {
        ty_http_respond(req, 500, "text/plain", NULL, "out of memory\n", 14);
        return;
    }
    ty_http_respond(req, 200, TY_METRICS_CONTENT_TYPE, NULL, body, len);
    free(body);
}

/* Peer reads between prefill nodes' page caches (ty_node_metrics_peer_*). */
static int peer_families(ty_node_metrics_t *m)
{
    static const char *const xl[] = {"transport"}, *const rl[] = {"result"};
    ty_metrics_family_t *bytes, *blocks, *pins;
    int rc;
    if ((rc = ty_metrics_counter_new(m->reg, &bytes, "tycho_node_peer_fetch_bytes_total",
                                     "KV bytes of planned prefix blocks read from other prefill "
                                     "nodes' page caches, by transport.", xl, 1)) ||
        (rc = ty_metrics_counter_new(m->reg, &blocks, "tycho_node_peer_fetch_blocks_total",
                                     "Planned prefix blocks from other prefill nodes' caches: "
                                     "read, or failed (not pinned there, timed out, a read "
                                     "error: computed instead).", rl, 1)) ||
        (rc = ty_metrics_counter_new(m->reg, &pins, "tycho_node_peer_pins_total",
                                     "Peers' requests to pin blocks of this node's cache for "
                                     "their reads: pinned, or refused (no block held).", rl, 1)))
        return rc;
    for (int x = 0; x < N_XPORT; x++)
        if ((rc = child(bytes, xports[x], NULL, &m->peer_bytes[x])))
            return rc;
    if ((rc = child(blocks, "read", NULL, &m->peer_blocks[0])) ||
        (rc = child(blocks, "failed", NULL, &m->peer_blocks[1])) ||
        (rc = child(pins, "pinned", NULL, &m->peer_pins[0])) ||
        (rc = child(pins, "refused", NULL, &m->peer_pins[1])))
        return rc;
    return 0;
}

static int families(ty_node_metrics_t *m, const struct ty_node_metrics_opts *o)
{
    ty_metrics_family_t *af;
    if (ty_metrics_counter_new(m->reg, &af, "tycho_auth_failures_total",
                               "connections to or from this process that failed the cluster "
                               "handshake (wrong or no secret, or none in time)", NULL, 0) ||
        ty_metrics_child_get(af, NULL, &m->auth_failures))
        return TY_ENOMEM;
    m->xfer = o->xfer;
    if (ty_metrics_counter_new(m->reg, &af, "tycho_kv_writes_fenced_total",
                               "KV writes into this node refused by its write fence: a "
                               "superseded prefill attempt's late writes", NULL, 0) ||
        ty_metrics_child_get(af, NULL, &m->fenced) ||
        ty_metrics_counter_new(m->reg, &af, "tycho_transfer_refused_connections_total",
                               "inbound transfer connections refused (over the cap) or "
                               "unproven ones pushed out", NULL, 0) ||
        ty_metrics_child_get(af, NULL, &m->refused_conns))
        return TY_ENOMEM;
    ty_metrics_family_t *f, *bytes, *handoffs, *seconds;
    const char *dir_x[] = {"direction", "transport"};
    const char *state[] = {"device", "state"};
    const char *info[] = {"role", "backend", "device", "transport"};
    const char *info_v[] = {o->role, o->backend, o->device, o->transport};
    ty_metrics_child_t *c;
    int rc;
    if ((rc = ty_metrics_gauge_new(m->reg, &f, "tycho_node_info",
                                   "The node's role, backend, KV device and transport setting "
                                   "(always 1).", info, 4)) ||
        (rc = ty_metrics_child_get(f, info_v, &c)))
        return rc;
    ty_metrics_gauge_set(c, 1);
    if ((rc = ty_metrics_counter_new(m->reg, &bytes, "tycho_node_kv_transfer_bytes_total",
                                     "KV bytes handed off between prefill and decode nodes, by "
                                     "direction (sent, received) and transport.", dir_x, 2)) ||
        (rc = ty_metrics_counter_new(m->reg, &handoffs, "tycho_node_kv_handoffs_total",
                                     "Requests whose KV was handed off, by direction and "
                                     "transport.", dir_x, 2)) ||
        (rc = ty_metrics_histogram_new(m->reg, &seconds, "tycho_node_kv_transfer_seconds",
                                       "One request's KV handoff, first layer written to last "
                                       "layer landed (as the prefill node measured it).",
                                       dir_x, 2, kv_buckets,
                                       sizeof(kv_buckets) / sizeof(kv_buckets[0]))))
        return rc;
    for (int d = 0; d < 2; d++) /* every series exists from the start, at zero */
        for (int x = 0; x < N_XPORT; x++) {
            const char *dir = d ? "received" : "sent";
            if ((rc = child(bytes, dir, xports[x], &m->kv_bytes[d][x])) ||
                (rc = child(handoffs, dir, xports[x], &m->kv_handoffs[d][x])) ||
                (rc = child(seconds, dir, xports[x], &m->kv_seconds[d][x])))
                return rc;
        }
    if ((rc = peer_families(m)))
        return rc;
    if ((rc = ty_metrics_gauge_new(m->reg, &f, "tycho_node_kv_pages",
                                   "KV pages per layer on the device, by state (used: held by "
                                   "requests; free: free or cached prefixes).", state, 2)) ||
        (rc = child(f, o->device, "used", &m->pages_used)) ||
        (rc = child(f, o->device, "free", &m->pages_free)) ||
        (rc = ty_metrics_gauge_new(m->reg, &f, "tycho_node_requests_running",
                                   "Requests in the engine's batch.", NULL, 0)) ||
        (rc = child(f, NULL, NULL, &m->running)) ||
        (rc = ty_metrics_gauge_new(m->reg, &f, "tycho_node_requests_waiting",
                                   "Requests waiting for the engine.", NULL, 0)) ||
        (rc = child(f, NULL, NULL, &m->queued)) ||
        (rc = ty_metrics_gauge_new(m->reg, &f, "tycho_node_preemptions",
                                   "Sequences preempted since the node started (decode).",
                                   NULL, 0)) ||
        (rc = child(f, NULL, NULL, &m->preempted)) ||
        (rc = ty_metrics_histogram_new(m->reg, &f, "tycho_node_step_seconds",
                                       "Duration of one forward call of the engine.", NULL, 0,
                                       step_buckets,
                                       sizeof(step_buckets) / sizeof(step_buckets[0]))) ||
        (rc = child(f, NULL, NULL, &m->step_seconds)) ||
        (rc = ty_metrics_histogram_new(m->reg, &f, "tycho_node_batch_size",
                                       "Requests in one forward call.", NULL, 0, batch_buckets,
                                       sizeof(batch_buckets) / sizeof(batch_buckets[0]))) ||
        (rc = child(f, NULL, NULL, &m->batch_size)) ||
        (rc = ty_metrics_counter_new(m->reg, &f, "tycho_node_step_tokens_total",
                                     "Tokens computed by forward calls (prompt tokens on a "
                                     "prefill node, sequences stepped on a decode node).",
                                     NULL, 0)) ||
        (rc = child(f, NULL, NULL, &m->step_tokens)))
        return rc;
    return 0;
}

int ty_node_metrics_new(ty_node_metrics_t **out, const struct ty_node_metrics_opts *o)
{
    *out = NULL;
    ty_node_metrics_t *m = calloc(1, sizeof(*m));
    if (!m)
        return TY_ENOMEM;
    m->pages_total = o->pages_total;
    int rc = ty_metrics_registry_new(&m->reg);
    if (!rc)
        rc = families(m, o);
    struct ty_http_server_opts ho = {.host = o->host, .port = o->port, .max_connections = 64,
                                     .max_body_bytes = 4096, .handler = on_http, .arg = m};
    if (!rc && (rc = ty_http_server_new(&m->http, o->loop, &ho)))
        TY_LOG_ERROR("node", "metrics: cannot listen on %s:%u: %s", o->host, o->port,
                     ty_strerror(rc));
    if (rc) {
        ty_metrics_registry_free(m->reg);
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

uint16_t ty_node_metrics_port(const ty_node_metrics_t *m)
{
    return m ? ty_http_server_port(m->http) : 0;
}

void ty_node_metrics_set_load(ty_node_metrics_t *m, ty_node_load_cb load, void *arg)
{
    m->load = load;
    m->load_arg = arg;
}

void ty_node_metrics_set_agent(ty_node_metrics_t *m, const ty_node_agent_t *agent)
{
    m->agent = agent;
}

void ty_node_metrics_kv(ty_node_metrics_t *m, bool sent, const char *transport, uint64_t bytes,
                        uint64_t us)
{
    if (!m || !transport)
        return;
    int x = 0;
    while (x < N_XPORT && strcmp(transport, xports[x]))
        x++;
    if (x == N_XPORT) /* a peer's word (KvReady): only the series made at start, no new ones */
        return;
    int d = !sent;
    ty_metrics_counter_add(m->kv_bytes[d][x], (double)bytes);
    ty_metrics_counter_inc(m->kv_handoffs[d][x]);
    ty_metrics_histogram_observe(m->kv_seconds[d][x], (double)us / 1e6);
}

void ty_node_metrics_peer_read(ty_node_metrics_t *m, const char *transport, uint64_t bytes,
                               uint64_t us)
{
    (void)us;
    if (!m || !transport)
        return;
    for (int x = 0; x < N_XPORT; x++)
        if (!strcmp(transport, xports[x]))
            ty_metrics_counter_add(m->peer_bytes[x], (double)bytes);
}

void ty_node_metrics_peer_blocks(ty_node_metrics_t *m, uint32_t read, uint32_t failed)
{
    if (!m)
        return;
    ty_metrics_counter_add(m->peer_blocks[0], read);
    ty_metrics_counter_add(m->peer_blocks[1], failed);
}

void ty_node_metrics_peer_pins(ty_node_metrics_t *m, uint32_t pinned)
{
    if (!m)
        return;
    ty_metrics_counter_inc(m->peer_pins[pinned ? 0 : 1]);
}

void ty_node_metrics_step(void *arg, const struct ty_timing_sample *s)
{
    ty_node_metrics_t *m = arg;
    ty_metrics_histogram_observe(m->step_seconds, (double)s->duration_us / 1e6);
    ty_metrics_histogram_observe(m->batch_size, (double)s->batch_size);
    ty_metrics_counter_add(m->step_tokens, (double)s->n_tokens);
}

static void on_http_closed(void *arg)
{
    ty_node_metrics_t *m = arg;
    m->http = NULL;
}

void ty_node_metrics_close(ty_node_metrics_t *m)
{
    if (m && m->http)
        ty_http_server_close(m->http, on_http_closed, m);
}

void ty_node_metrics_free(ty_node_metrics_t *m)
{
    if (!m)
        return;
    TY_ASSERT(!m->http);
    ty_metrics_registry_free(m->reg);
    free(m);
}
