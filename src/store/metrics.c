/* tycho-store's Prometheus metrics (store-impl.h): /metrics, /health and /ready over HTTP on
 * metrics_port. The figures are read from the master's metadata and the pool node when a
 * scrape arrives (loop thread); cumulative ones become counters fed by their growth (a master
 * elected anew starts its figures again: the counters then keep their value). */
#include "store-metrics.h"

#include "tycho/auth.h"
#include "tycho/errors.h"
#include "tycho/http.h"
#include "tycho/log.h"
#include "tycho/metrics.h"

#include <stdlib.h>
#include <string.h>

enum { M_EVICT, M_OFFLOAD, M_EXPIRED, M_DEAD, M_REPL_START, M_REPL_DONE, M_REPL_FAIL, M_COLD,
       N_MCOUNT };
enum { N_SSD_CSUM, N_SSD_EVICT, N_XIN, N_XOUT, N_XREF, N_NCOUNT };

struct ty_store_metrics {
    ty_metrics_registry_t *reg;
    ty_http_server_t *http;
    ty_store_master_t *const *master; /* the app's pointers: a master may come later (etcd) */
    ty_store_node_t *const *node;
    /* master */
    ty_metrics_child_t *leader, *objects, *pending, *nodes_alive, *m_dram_cap, *m_dram_used;
    ty_metrics_child_t *mc[N_MCOUNT], *hot;
    uint64_t mseen[N_MCOUNT];
    ty_metrics_family_t *reads_fam; /* tycho_store_reads_total{node} */
    struct node_reads {
        char name[TY_STORE_NODE_NAME_MAX + 1];
        ty_metrics_child_t *c;
        uint64_t seen;
    } *reads;
    size_t n_reads;
    /* pool node */
    ty_metrics_child_t *registered, *dram_cap, *dram_used, *blocks_dram, *blocks_ssd, *ssd_cap,
        *ssd_used, *jobs;
    ty_metrics_child_t *nc[N_NCOUNT];
    uint64_t nseen[N_NCOUNT];
    ty_metrics_child_t *auth_failures;
    uint64_t auth_seen;
};

/* Reads the master named each pool node for, by node name (a node gone keeps its series). */
static void refresh_reads(ty_store_metrics_t *m, const ty_store_master_t *ms)
{
    struct ty_store_node_info ni;
    int rc;
    for (uint32_t id = 0; (rc = ty_store_master_node_info(ms, id, &ni)) != TY_EINVAL; id++) {
        if (rc != 0)
            continue;
        size_t k = 0;
        while (k < m->n_reads && strcmp(m->reads[k].name, ni.name) != 0)
            k++;
        if (k == m->n_reads) {
            const char *v[] = {ni.name};
            ty_metrics_child_t *c;
            if (ty_metrics_child_get(m->reads_fam, v, &c) != 0)
                continue;
            m->reads = realloc(m->reads, (m->n_reads + 1) * sizeof(*m->reads));
            TY_ASSERT(m->reads != NULL);
            memset(&m->reads[k], 0, sizeof(m->reads[k]));
            strcpy(m->reads[k].name, ni.name);
            m->reads[k].c = c;
            m->n_reads++;
        }
        ty_metrics_counter_follow(m->reads[k].c, ni.reads, &m->reads[k].seen);
    }
}

static void refresh(ty_store_metrics_t *m)
{
    const ty_store_master_t *ms = m->master ? *m->master : NULL;
    if (m->leader)
        ty_metrics_gauge_set(m->leader, ms != NULL);
    if (ms && m->objects) {
        struct ty_store_meta_stats st;
        ty_store_master_stats(ms, &st);
        ty_metrics_gauge_set(m->objects, (double)st.objects);
        ty_metrics_gauge_set(m->pending, (double)st.pending_puts);
        ty_metrics_gauge_set(m->nodes_alive, (double)st.nodes_alive);
        ty_metrics_gauge_set(m->m_dram_cap, (double)st.dram_bytes);
        ty_metrics_gauge_set(m->m_dram_used, (double)st.dram_used);
        ty_metrics_gauge_set(m->hot, (double)st.hot_blocks);
        uint64_t now[N_MCOUNT] = {st.evictions,
                                  st.offloads,
                                  st.expired_puts,
                                  st.dead_nodes,
                                  st.replications_started,
                                  st.replications_done,
                                  st.replications_failed,
                                  st.cold_evictions};
        for (int i = 0; i < N_MCOUNT; i++)
            ty_metrics_counter_follow(m->mc[i], now[i], &m->mseen[i]);
        if (m->reads_fam)
            refresh_reads(m, ms);
    }
    ty_store_node_t *n = m->node ? *m->node : NULL;
    if (n && m->registered) {
        struct ty_store_node_stats st;
        ty_store_node_stats(n, &st);
        ty_metrics_gauge_set(m->registered, st.registered);
        ty_metrics_gauge_set(m->dram_cap, (double)st.dram_bytes);
        ty_metrics_gauge_set(m->dram_used, (double)st.dram_used);
        ty_metrics_gauge_set(m->blocks_dram, (double)st.dram_blocks);
        ty_metrics_gauge_set(m->blocks_ssd, (double)st.ssd_blocks);
        ty_metrics_gauge_set(m->ssd_cap, (double)st.ssd_bytes);
        ty_metrics_gauge_set(m->ssd_used, (double)st.ssd_used);
        ty_metrics_gauge_set(m->jobs, st.jobs);
        uint64_t now[N_NCOUNT] = {st.ssd_checksum_errors, st.ssd_buckets_evicted,
                                  st.xfer_bytes_in, st.xfer_bytes_out, st.xfer_refused};
        for (int i = 0; i < N_NCOUNT; i++)
            ty_metrics_counter_follow(m->nc[i], now[i], &m->nseen[i]);
    }
    ty_metrics_counter_follow(m->auth_failures, ty_auth_failures(), &m->auth_seen);
}

static void respond(ty_http_req_t *req, int status, const char *text)
{
    ty_http_respond(req, status, "text/plain", NULL, text, strlen(text));
}

static void on_http(void *arg, ty_http_req_t *req)
{
    ty_store_metrics_t *m = arg;
    const char *path = ty_http_req_path(req);
    if (strcmp(ty_http_req_method(req), "GET") != 0) {
        ty_http_respond(req, 405, "text/plain", "Allow: GET\r\n", "GET only\n", 9);
        return;
    }
    if (!strcmp(path, "/health")) {
        respond(req, 200, "ok\n");
        return;
    }
    if (!strcmp(path, "/ready")) {
        /* a master: serving (elected, where it campaigns); a pool node: registered */
        ty_store_node_t *n = m->node ? *m->node : NULL;
        struct ty_store_node_stats st = {0};
        if (n)
            ty_store_node_stats(n, &st);
        if (m->master && !*m->master && m->leader)
            respond(req, 503, "not the pool's master (standby)\n");
        else if (n && !st.registered)
            respond(req, 503, "not registered with the pool's master\n");
        else
            respond(req, 200, "ready\n");
        return;
    }
    if (strcmp(path, "/metrics") != 0) {
        respond(req, 404, "not found (/metrics, /health, /ready)\n");
        return;
    }
    refresh(m);
    char *body = NULL;
    size_t len = 0;
    if (ty_metrics_render(m->reg, &body, &len) != 0) {
        respond(req, 500, "out of memory\n");
        return;
    }
    ty_http_respond(req, 200, TY_METRICS_CONTENT_TYPE, NULL, body, len);
    free(body);
}

/* A family (kind 'g' gauge, 'c' counter) with no label (c0) or one label of two values. */
static int fam(ty_metrics_registry_t *reg, char kind, const char *name, const char *help,
               const char *label, const char *v0, ty_metrics_child_t **c0, const char *v1,
               ty_metrics_child_t **c1)
{
    ty_metrics_family_t *f;
    const char *names[] = {label};
    size_t nl = label ? 1 : 0;
    int rc = kind == 'g' ? ty_metrics_gauge_new(reg, &f, name, help, label ? names : NULL, nl)
                         : ty_metrics_counter_new(reg, &f, name, help, label ? names : NULL, nl);
    const char *a[] = {v0}, *b[] = {v1};
    if (!rc)
        rc = ty_metrics_child_get(f, label ? a : NULL, c0);
    if (!rc && label && v1)
        rc = ty_metrics_child_get(f, b, c1);
    return rc;
}

/* The master's hot-block families: hot blocks, replications by outcome, cold evictions, reads
 * per node (readers spread over a hot block's replicas). */
static int hot_families(ty_store_metrics_t *m)
{
    ty_metrics_registry_t *r = m->reg;
    static const char *const state[] = {"state"}, *const node[] = {"node"};
    static const char *const sv[] = {"started", "done", "failed"};
    ty_metrics_family_t *f;
    int rc = fam(r, 'g', "tycho_store_hot_blocks",
                 "blocks whose decayed read rate crossed hot_reads_per_s (replicated to "
                 "hot_replicas pool nodes)", NULL, NULL, &m->hot, NULL, NULL) ||
             fam(r, 'c', "tycho_store_cold_evictions_total",
                 "extra replicas of blocks no longer hot, evicted before other blocks", NULL,
                 NULL, &m->mc[M_COLD], NULL, NULL);
    if (!rc)
        rc = ty_metrics_counter_new(r, &f, "tycho_store_replications_total",
                                    "REPLICATE jobs (a pool node copies a block from another): "
                                    "queued (started), made a readable replica (done), or not "
                                    "(failed)", state, 1);
    for (int i = 0; !rc && i < 3; i++)
        rc = ty_metrics_child_get(f, &sv[i], &m->mc[M_REPL_START + i]);
    if (!rc)
        rc = ty_metrics_counter_new(r, &m->reads_fam, "tycho_store_reads_total",
                                    "gets the master answered with this pool node's replica "
                                    "first (the one the client reads; a block's replicas take "
                                    "turns)", node, 1);
    return rc;
}

static int families(ty_store_metrics_t *m, bool master, bool node)
{
    ty_metrics_registry_t *r = m->reg;
    int rc = fam(r, 'c', "tycho_auth_failures_total",
                 "connections to or from this process that failed the cluster handshake (wrong "
                 "or no secret, or none in time)", NULL, NULL, &m->auth_failures, NULL, NULL);
    if (!rc && master)
        rc = fam(r, 'g', "tycho_store_master_serving",
                 "1 while this process serves as the KV pool's master (0: a standby that "
                 "campaigns in etcd)", NULL, NULL, &m->leader, NULL, NULL) ||
             fam(r, 'g', "tycho_store_objects", "objects (KV blocks) the pool holds", NULL, NULL,
                 &m->objects, NULL, NULL) ||
             fam(r, 'g', "tycho_store_pending_puts", "puts allocated and not yet committed",
                 NULL, NULL, &m->pending, NULL, NULL) ||
             fam(r, 'g', "tycho_store_nodes_alive", "pool nodes registered and heartbeating",
                 NULL, NULL, &m->nodes_alive, NULL, NULL) ||
             fam(r, 'g', "tycho_store_dram_bytes", "the pool's DRAM over its live nodes",
                 "state", "capacity", &m->m_dram_cap, "used", &m->m_dram_used) ||
             fam(r, 'c', "tycho_store_evictions_total",
                 "objects evicted to stay under the high watermark", NULL, NULL, &m->mc[M_EVICT],
                 NULL, NULL) ||
             fam(r, 'c', "tycho_store_offloads_total", "objects moved from DRAM to SSD", NULL,
                 NULL, &m->mc[M_OFFLOAD], NULL, NULL) ||
             fam(r, 'c', "tycho_store_expired_puts_total",
                 "puts never committed within put_timeout (their space taken back)", NULL, NULL,
                 &m->mc[M_EXPIRED], NULL, NULL) ||
             fam(r, 'c', "tycho_store_dead_nodes_total",
                 "pool nodes declared dead (missed heartbeats for node_timeout)", NULL, NULL,
                 &m->mc[M_DEAD], NULL, NULL) ||
             hot_families(m);
    if (!rc && node)
        rc = fam(r, 'g', "tycho_pool_node_registered",
                 "1 while this pool node is registered with a master", NULL, NULL,
                 &m->registered, NULL, NULL) ||
             fam(r, 'g', "tycho_pool_node_dram_bytes", "this pool node's DRAM segment", "state",
                 "capacity", &m->dram_cap, "used", &m->dram_used) ||
             fam(r, 'g', "tycho_pool_node_blocks", "KV blocks this pool node holds, per tier",
                 "tier", "dram", &m->blocks_dram, "ssd", &m->blocks_ssd) ||
             fam(r, 'g', "tycho_pool_node_ssd_bytes", "this pool node's SSD tier", "state",
                 "capacity", &m->ssd_cap, "used", &m->ssd_used) ||
             fam(r, 'g', "tycho_pool_node_jobs_running",
                 "the master's jobs (offload, load, replicate) running here", NULL, NULL,
                 &m->jobs, NULL, NULL) ||
             fam(r, 'c', "tycho_pool_node_ssd_checksum_errors_total",
                 "SSD blocks dropped because their checksum failed", NULL, NULL,
                 &m->nc[N_SSD_CSUM], NULL, NULL) ||
             fam(r, 'c', "tycho_pool_node_ssd_buckets_evicted_total",
                 "SSD bucket files deleted for space", NULL, NULL, &m->nc[N_SSD_EVICT], NULL,
                 NULL) ||
             fam(r, 'c', "tycho_pool_node_transfer_bytes_total",
                 "KV bytes peers wrote into (in) or read from (out) this pool node over tcp or "
                 "rdma (shared memory on one host is not counted)", "direction",
                 "in", &m->nc[N_XIN], "out", &m->nc[N_XOUT]) ||
             fam(r, 'c', "tycho_pool_node_refused_accesses_total",
                 "peer accesses outside this node's registered memory, refused", NULL, NULL,
                 &m->nc[N_XREF], NULL, NULL);
    return rc ? TY_ENOMEM : 0;
}

int ty__store_metrics_new(ty_store_metrics_t **out, uv_loop_t *loop, const char *host,
                          uint16_t port, ty_store_master_t *const *master,
                          ty_store_node_t *const *node)
{
    ty_store_metrics_t *m = calloc(1, sizeof(*m));
    if (!m)
        return TY_ENOMEM;
    m->master = master;
    m->node = node;
    int rc = ty_metrics_registry_new(&m->reg);
    if (!rc)
        rc = families(m, master != NULL, node != NULL);
    struct ty_http_server_opts ho = {.host = host, .port = port, .max_connections = 64,
                                     .max_body_bytes = 4096, .handler = on_http, .arg = m};
    if (!rc && (rc = ty_http_server_new(&m->http, loop, &ho)))
        TY_LOG_ERROR("store", "metrics: cannot listen on %s:%u: %s", host, port, ty_strerror(rc));
    if (rc) {
        ty_metrics_registry_free(m->reg);
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

uint16_t ty__store_metrics_port(const ty_store_metrics_t *m)
{
    return ty_http_server_port(m->http);
}

static void on_http_closed(void *arg)
{
    ty_store_metrics_t *m = arg;
    ty_metrics_registry_free(m->reg);
    free(m->reads);
    free(m);
}

void ty__store_metrics_close(ty_store_metrics_t *m)
{
    if (m)
        ty_http_server_close(m->http, on_http_closed, m);
}
