/* The node registry of the Conductor (conductor-impl.h): the RPC endpoint nodes register with
 * (RegisterNode, Heartbeat), one RPC client per live node, and a tick that declares a node
 * dead when its heartbeats stop for heartbeat_timeout or its connection dropped. A dead node
 * gets no new requests; its requests fail at once; it is used again after it registers. */
#include "conductor-impl.h"

#include "tycho/auth.h"
#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct ty__cnode *find_node(ty_conductor_t *c, const char *id)
{
    for (size_t i = 0; i < c->n_nodes; i++)
        if (!strcmp(c->nodes[i]->info.id, id))
            return c->nodes[i];
    return NULL;
}

struct ty__cnode *ty__conductor_pick(ty_conductor_t *c, int role)
{
    return ty__conductor_pick_except(c, role, NULL);
}

struct ty__cnode *ty__conductor_pick_except(ty_conductor_t *c, int role,
                                          const struct ty__cnode *except)
{
    struct ty__cnode *best = NULL;
    for (size_t i = 0; i < c->n_nodes; i++) {
        struct ty__cnode *n = c->nodes[i];
        if (n == except || !n->info.alive || n->lost || n->info.role != role || !n->rpc ||
            !ty__breaker_allows(n))
            continue;
        if (!best || n->info.inflight < best->info.inflight ||
            (n->info.inflight == best->info.inflight && n->info.served < best->info.served))
            best = n;
    }
    return best;
}

static void on_rpc_closed(void *arg)
{
    (void)arg;
}

/* ---- per-node metrics ------------------------------------------------------------------- */

static const char *role_name(int role)
{
    return role == TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL ? "prefill" : "decode";
}

static void node_metrics_init(ty_conductor_t *c)
{
    static const char *const nr[] = {"node", "role"}, *const nk[] = {"node", "kind"},
                             *const n1[] = {"node"};
    ty_metrics_registry_t *reg = c->o.metrics;
    if (!reg)
        return;
    ty_metrics_gauge_new(reg, &c->node_fam[0], "tycho_node_up",
                         "1 while the node is registered and heartbeating, 0 once it is down",
                         nr, 2);
    ty_metrics_gauge_new(reg, &c->node_fam[1], "tycho_node_kv_usage_ratio",
                         "used share of the node's KV pages, as last reported", nr, 2);
    ty_metrics_gauge_new(reg, &c->node_fam[2], "tycho_node_queued_requests",
                         "requests waiting on the node, as last reported", nr, 2);
    ty_metrics_gauge_new(reg, &c->node_fam[3], "tycho_node_running_requests",
                         "requests running on the node, as last reported", nr, 2);
    ty_metrics_counter_new(reg, &c->node_fam[4], "tycho_node_kv_pool_blocks_total",
                           "KV blocks a node read from (kind=read, prefill) or wrote to "
                           "(kind=written) the cluster KV pool", nk, 2);
    ty_metrics_counter_new(reg, &c->node_fam[5], "tycho_node_kv_pool_errors_total",
                           "KV pool operations of a node that failed (each a miss)", n1,
                           1);
    ty_metrics_counter_new(reg, &c->node_fam[6], "tycho_node_preemptions_total",
                           "sequences a decode node preempted (KV pages taken back to let "
                           "older ones grow; recomputed on the node)", n1, 1);
    ty_metrics_gauge_new(reg, &c->node_fam[7], "tycho_node_breaker_state",
                         "the node's circuit breaker: 0 closed (placed on), 1 open (out of "
                         "placement after failed requests), 2 half open (one request probes it)",
                         nr, 2);
    ty_metrics_counter_new(reg, &c->node_fam[8], "tycho_node_failed_requests_total",
                           "requests the node failed (no answer in node_answer_timeout, a "
                           "prefill that late, an error it did not mean as a refusal)", nr, 2);
    ty_metrics_family_t *f;
    if (!ty_metrics_counter_new(reg, &f, "tycho_requests_replaced_total",
                                "requests placed again on other nodes because a node failed "
                                "them before any token streamed", NULL, 0))
        ty_metrics_child_get(f, NULL, &c->replaced);
    if (!ty_metrics_counter_new(reg, &f, "tycho_prefill_retries_total",
                                "prefills sent again to another prefill node because theirs was "
                                "lost before the KV landed", NULL, 0))
        ty_metrics_child_get(f, NULL, &c->prefill_retries);
    if (!ty_metrics_counter_new(reg, &f, "tycho_requests_pipelined_total",
                                "requests whose prompt went through a group of prefill nodes "
                                "(chunked pipeline parallelism, pipeline.stages)", NULL, 0))
        ty_metrics_child_get(f, NULL, &c->m_pipelined);
    if (!ty_metrics_counter_new(reg, &f, "tycho_registrations_refused_total",
                                "node registrations refused because another live node holds "
                                "the name", NULL, 0))
        ty_metrics_child_get(f, NULL, &c->name_conflicts);
    if (!ty_metrics_counter_new(reg, &f, "tycho_auth_failures_total",
                                "connections to or from the Conductor that failed the cluster "
                                "handshake (wrong or no secret, or none in time)", NULL, 0))
        ty_metrics_child_get(f, NULL, &c->auth_failures);
}

/* A node (re)registered: its children, and counters that start again from its new life. */
static void node_metrics_bind(ty_conductor_t *c, struct ty__cnode *n)
{
    if (!c->node_fam[0])
        return;
    const char *nr[] = {n->info.id, role_name(n->info.role)};
    const char *rd[] = {n->info.id, "read"}, *wr[] = {n->info.id, "written"};
    const char *n1[] = {n->info.id};
    ty_metrics_child_get(c->node_fam[0], nr, &n->m_up);
    ty_metrics_child_get(c->node_fam[1], nr, &n->m_kv_usage);
    ty_metrics_child_get(c->node_fam[2], nr, &n->m_queued);
    ty_metrics_child_get(c->node_fam[3], nr, &n->m_running);
    if (c->node_fam[7] && c->node_fam[8]) {
        ty_metrics_child_get(c->node_fam[7], nr, &n->m_breaker);
        ty_metrics_child_get(c->node_fam[8], nr, &n->m_failed);
    }
    if (c->node_fam[4] && c->node_fam[5]) {
        ty_metrics_child_get(c->node_fam[4], rd, &n->m_pool[0]);
        ty_metrics_child_get(c->node_fam[4], wr, &n->m_pool[1]);
        ty_metrics_child_get(c->node_fam[5], n1, &n->m_pool[2]);
    }
    if (c->node_fam[6] && n->info.role == TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE)
        ty_metrics_child_get(c->node_fam[6], n1, &n->m_pool[3]);
    memset(n->pool_seen, 0, sizeof(n->pool_seen));
    if (n->m_up)
        ty_metrics_gauge_set(n->m_up, 1);
}

/* A node gone for good (its slot goes to another id): its series leave /metrics, so ids that
 * change at every restart do not grow the output without bound. */
static void node_metrics_unbind(struct ty__cnode *n)
{
    ty_metrics_child_t **all[] = {&n->m_up, &n->m_kv_usage, &n->m_queued, &n->m_running,
                                  &n->m_pool[0], &n->m_pool[1], &n->m_pool[2], &n->m_pool[3],
                                  &n->m_breaker, &n->m_failed};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        ty_metrics_child_remove(*all[i]);
        *all[i] = NULL;
    }
}

static void node_metrics_heartbeat(struct ty__cnode *n, const Tycho__V1__Load *l)
{
    if (!n->m_up)
        return;
    ty_metrics_gauge_set(n->m_kv_usage, l->kv_cache_usage);
    ty_metrics_gauge_set(n->m_queued, l->queued_requests);
    ty_metrics_gauge_set(n->m_running, l->running_requests);
    uint64_t now[4] = {l->kv_pool_read_blocks, l->kv_pool_written_blocks, l->kv_pool_errors,
                       l->preemptions};
    for (int k = 0; k < 4; k++) {
        if (n->m_pool[k] && now[k] > n->pool_seen[k])
            ty_metrics_counter_add(n->m_pool[k], (double)(now[k] - n->pool_seen[k]));
        n->pool_seen[k] = now[k] > n->pool_seen[k] ? now[k] : n->pool_seen[k];
    }
}

void ty__conductor_node_down(ty_conductor_t *c, struct ty__cnode *n, const char *why)
{
    if (n->info.alive)
        TY_LOG_WARN("cluster", "node %s (%s) is down: %s", n->info.id, n->info.address, why);
    if (n->m_up)
        ty_metrics_gauge_set(n->m_up, 0);
    n->info.alive = false;
    n->lost = false;
    ty__place_node_down(c, n);
    ty__conductor_fail_node(c, n, TY_EUNAVAIL, why);
    if (n->rpc) {
        ty_rpc_client_t *r = n->rpc;
        n->rpc = NULL;
        ty_rpc_client_close(r, on_rpc_closed, NULL); /* pending calls complete: ECANCELED */
    }
}

static void cluster_tick(uv_timer_t *t);

static void on_node_state(ty_rpc_client_t *cl, bool connected, int reason, void *arg)
{
    struct ty__cnode *n = arg;
    (void)cl;
    if (connected || !n->info.alive)
        return;
    TY_LOG_WARN("cluster", "lost the connection to %s: %s", n->info.id, ty_strerror(reason));
    n->lost = true; /* reaped on the loop, outside the client's callback */
    ty__place_node_down(n->c, n); /* no new placements on it meanwhile (scheduler only) */
    uv_timer_start(&n->c->tick, cluster_tick, 0, 100);
}

static int node_connect(ty_conductor_t *c, struct ty__cnode *n)
{
    char host[128];
    uint16_t port;
    if (ty_config_split_hostport(n->info.address, host, sizeof(host), &port))
        return TY_EINVAL;
    struct ty_rpc_client_opts co = {.loop = c->o.loop, .host = host, .port = port,
                                    .connect_timeout_ms = 2000, .backoff_initial_ms = 50,
                                    .backoff_max_ms = 500, .state_cb = on_node_state,
                                    .state_arg = n, .max_frame_size = 64u << 20,
                                    .auth = c->o.auth};
    return ty_rpc_client_new(&n->rpc, &co);
}

/* Check a RegisterNode; on failure `why` says what is wrong. */
static bool register_valid(const Tycho__V1__RegisterNode *m, char *why, size_t cap)
{
    const char *bad = NULL;
    enum ty_kv_dtype dt;
    if (m->protocol_version != TYCHO__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT)
        bad = "unsupported protocol_version";
    else if (m->role != TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL &&
             m->role != TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE)
        bad = "role must be prefill or decode";
    else if (!m->node_id[0] || strlen(m->node_id) >= 64)
        bad = "node_id must have 1..63 characters";
    else if (!strchr(m->address, ':') || strlen(m->address) >= 128)
        bad = "address must be host:port";
    else if (!m->transfer_segment[0] || strlen(m->transfer_segment) > TY_XFER_NAME_MAX)
        bad = "transfer_segment missing or too long";
    else if (!m->capacity || !m->capacity->block_tokens)
        bad = "capacity.block_tokens missing";
    else if (m->model && m->model->dtype[0] && ty_kv_dtype_parse(m->model->dtype, &dt))
        bad = "model.dtype (the KV cache's) must be f32, f16 or bf16";
    if (bad)
        snprintf(why, cap, "%s", bad);
    return !bad;
}

/* The node's model has the Conductor's geometry (a node without a fingerprint is trusted):
 * another model's KV pages, token ids and prefix hashes would not fit. */
static bool model_matches(const ty_conductor_t *c, const Tycho__V1__RegisterNode *m, char *why,
                          size_t cap)
{
    if (!m->model || !c->o.model || (!m->model->n_layers && !m->model->head_dim))
        return true;
    const struct ty_model_config *mc = ty_model_config(c->o.model);
    if (m->model->n_layers == mc->n_layers && m->model->n_kv_heads == mc->n_kv_heads &&
        m->model->head_dim == mc->head_dim)
        return true;
    snprintf(why, cap, "model %s has %u layers x %u KV heads x %u dims; the Conductor's "
             "(%s) %u x %u x %u", m->model->model_id, m->model->n_layers, m->model->n_kv_heads,
             m->model->head_dim, ty_model_desc(c->o.model), mc->n_layers, mc->n_kv_heads,
             mc->head_dim);
    return false;
}

/* A dead node's entry that nothing refers to any more (no request names it), so that its slot
 * can serve a node with another id; NULL when every entry is alive or still referred to. */
static struct ty__cnode *dead_entry(ty_conductor_t *c)
{
    for (size_t i = 0; i < c->n_nodes; i++) {
        struct ty__cnode *n = c->nodes[i];
        if (n->info.alive || n->rpc || n->lost || n->in_sched)
            continue;
        bool used = false;
        for (const struct ty__creq *r = c->reqs; r && !used; r = r->next)
            used = r->pnode == n || r->dnode == n || r->queued_on == n;
        if (!used)
            return n;
    }
    return NULL;
}

/* The entry of a node id not seen before: a new slot, or when all are taken the slot of a dead
 * node (nodes without a configured name get a new id at every restart). *fresh: appended. */
static struct ty__cnode *new_entry(ty_conductor_t *c, const char *id, bool *fresh, char *why,
                                   size_t cap)
{
    struct ty__cnode *n;
    *fresh = c->n_nodes < TY_CONDUCTOR_MAX_NODES;
    if (*fresh) {
        if (!(n = calloc(1, sizeof(*n))))
            return NULL;
        n->slot = (uint32_t)c->n_nodes;
        c->nodes[c->n_nodes++] = n;
    } else if ((n = dead_entry(c))) {
        TY_LOG_INFO("cluster", "node %s takes the slot of %s, down since %llu ms", id,
                    n->info.id, (unsigned long long)(ty_clock_ms() - n->last_hb_ms));
        uint32_t slot = n->slot;
        node_metrics_unbind(n);
        memset(n, 0, sizeof(*n));
        n->slot = slot;
    } else {
        snprintf(why, cap, "too many nodes (%d alive or in use)", TY_CONDUCTOR_MAX_NODES);
        return NULL;
    }
    n->c = c;
    snprintf(n->info.id, sizeof(n->info.id), "%s", id);
    return n;
}

/* A registration refused before the node was ever up gives its new slot back. */
static void drop_fresh(ty_conductor_t *c, struct ty__cnode *n)
{
    TY_ASSERT(c->nodes[c->n_nodes - 1] == n);
    c->nodes[--c->n_nodes] = NULL;
    free(n);
}

/* The name is a lease held by the registered process while it is live: another process (another
 * instance) that registers it meanwhile is refused, so it cannot take a live node's requests. */
static bool name_held(ty_conductor_t *c, const struct ty__cnode *n,
                      const Tycho__V1__RegisterNode *m, char *why, size_t cap)
{
    uint64_t quiet = ty_clock_ms() - n->last_hb_ms;
    if (!n->info.alive || n->lost || quiet > c->o.heartbeat_timeout_ms)
        return false;
    if (n->instance_len && m->instance.len == n->instance_len &&
        !memcmp(m->instance.data, n->instance, n->instance_len))
        return false; /* the holder itself, registering again */
    if (c->name_conflicts)
        ty_metrics_counter_inc(c->name_conflicts);
    int w = snprintf(why, cap, "node_id '%s' is held by a live node at %s", m->node_id,
                     n->info.address);
    if (w > 0 && (size_t)w < cap)
        snprintf(why + w, cap - (size_t)w, " (heartbeat %llu ms ago); released when it stops "
                 "or misses heartbeats for %u ms", (unsigned long long)quiet,
                 c->o.heartbeat_timeout_ms);
    return true;
}

static int node_register(ty_conductor_t *c, const Tycho__V1__RegisterNode *m, char *why,
                         size_t cap, struct ty__cnode **out)
{
    struct ty__cnode *n = find_node(c, m->node_id);
    bool fresh = false;
    if (n && name_held(c, n, m, why, cap))
        return TY_EEXIST;
    if (!n) {
        if (!(n = new_entry(c, m->node_id, &fresh, why, cap)))
            return why[0] ? TY_ENOSPC : TY_ENOMEM;
    } else if (n->info.alive || n->rpc) {
        ty__conductor_node_down(c, n, "registered again (restarted)");
    }
    if (n->m_up && n->info.role != (int)m->role)
        node_metrics_unbind(n); /* its series are labelled with the old role */
    n->info.role = m->role;
    n->instance_len = m->instance.len <= sizeof(n->instance) ? m->instance.len : 0;
    memcpy(n->instance, m->instance.data, n->instance_len);
    snprintf(n->info.address, sizeof(n->info.address), "%s", m->address);
    snprintf(n->segment, sizeof(n->segment), "%s", m->transfer_segment);
    n->block_tokens = m->capacity->block_tokens;
    snprintf(n->kv_dtype, sizeof(n->kv_dtype), "%s",
             m->model && m->model->dtype[0] ? m->model->dtype : "f32");
    const struct ty_model_config *mc = c->o.model ? ty_model_config(c->o.model) : NULL;
    bool fp = m->model && (m->model->n_layers || m->model->head_dim);
    n->n_layers = fp ? m->model->n_layers : mc ? mc->n_layers : 0;
    n->n_kv_heads = fp ? m->model->n_kv_heads : mc ? mc->n_kv_heads : 0;
    n->head_dim = fp ? m->model->head_dim : mc ? mc->head_dim : 0;
    snprintf(n->backend, sizeof(n->backend), "%s", m->backend[0] ? m->backend : "cpu");
    snprintf(n->kv_device, sizeof(n->kv_device), "%s", m->kv_device[0] ? m->kv_device : "cpu");
    n->transports[0] = '\0';
    for (size_t i = 0; i < m->n_transports; i++) {
        size_t l = strlen(n->transports);
        snprintf(n->transports + l, sizeof(n->transports) - l, "%s%s", l ? "," : "",
                 m->transports[i]);
    }
    n->kv_pages = m->capacity->kv_pages;
    n->max_batch = m->capacity->max_batch;
    n->max_batch_prompts = m->capacity->max_batch_prompts;
    n->max_ctx = m->capacity->max_ctx;
    n->interleaves = m->capacity->interleaves;
    int rc = ty__place_node_up(c, n, why, cap);
    if (!rc && (rc = node_connect(c, n))) {
        ty__place_node_down(c, n);
        snprintf(why, cap, "cannot connect to %s: %s", m->address, ty_strerror(rc));
    }
    if (rc) {
        if (fresh)
            drop_fresh(c, n);
        return rc;
    }
    n->info.alive = true;
    n->lost = false;
    n->session = ++c->next_session;
    n->last_hb_ms = ty_clock_ms();
    memset(&n->info.load, 0, sizeof(n->info.load));
    n->info.load.free_pages = m->capacity->kv_pages;
    node_metrics_bind(c, n);
    ty__breaker_reset(c, n);
    *out = n;
    return 0;
}

static void cluster_tick(uv_timer_t *t);

static void on_register(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_conductor_t *c = arg;
    const Tycho__V1__RegisterNode *m = msg;
    char why[256] = "";
    struct ty__cnode *n = NULL;
    Tycho__V1__RegisterNodeReply r = TYCHO__V1__REGISTER_NODE_REPLY__INIT;
    r.protocol_version = TYCHO__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    if (register_valid(m, why, sizeof(why)) && model_matches(c, m, why, sizeof(why)) &&
        !node_register(c, m, why, sizeof(why), &n)) {
        r.accepted = true;
        r.session_id = n->session;
        r.heartbeat_interval_ms = c->o.heartbeat_interval_ms;
        uv_timer_start(&c->tick, cluster_tick, 0, 100); /* dispatch waiting requests */
        TY_LOG_INFO("cluster", "node %s registered: %s at %s, segment %s", n->info.id,
                    n->info.role == TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL ? "prefill"
                                                                             : "decode",
                    n->info.address, n->segment);
        if (n->max_ctx && n->max_ctx < c->o.max_ctx)
            TY_LOG_WARN("cluster", "node %s holds sequences of at most %u tokens, less than the "
                        "Conductor's max_ctx %u: while it is up, longer requests get a 400 "
                        "(give it more KV memory, or lower max_ctx)", n->info.id,
                        n->max_ctx, c->o.max_ctx);
    } else {
        r.reason = why;
        TY_LOG_WARN("cluster", "refused a registration of '%s': %s", m->node_id, why);
    }
    ty_rpc_call_reply_msg(call, &r.base);
}

static void on_heartbeat(ty_rpc_call_t *call, const void *msg, void *arg)
{
    ty_conductor_t *c = arg;
    const Tycho__V1__Heartbeat *m = msg;
    struct ty__cnode *n = find_node(c, m->node_id);
    Tycho__V1__HeartbeatReply r = TYCHO__V1__HEARTBEAT_REPLY__INIT;
    r.wall_ms = ty_wall_ms();
    if (n && n->info.alive && !n->lost && n->session == m->session_id) {
        r.known = true;
        n->last_hb_ms = ty_clock_ms();
        if (m->load) {
            n->info.load.queued_tokens = m->load->queued_tokens;
            n->info.load.running = m->load->running_requests;
            n->info.load.queued = m->load->queued_requests;
            n->info.load.free_pages = m->load->free_pages;
            n->info.load.kv_usage = m->load->kv_cache_usage;
            n->info.load.pool_read_blocks = m->load->kv_pool_read_blocks;
            n->info.load.pool_written_blocks = m->load->kv_pool_written_blocks;
            n->info.load.pool_errors = m->load->kv_pool_errors;
            n->info.load.preemptions = m->load->preemptions;
            if (m->load->preemptions < n->preempt_seen)
                n->preempt_seen = 0; /* the node restarted: its count began again */
            c->preemptions += m->load->preemptions - n->preempt_seen;
            n->preempt_seen = m->load->preemptions;
            node_metrics_heartbeat(n, m->load);
        }
        ty__place_heartbeat(c, n, m);
        ty__conductor_progress(c, n, m);
    }
    ty_rpc_call_reply_msg(call, &r.base);
}

/* Every 100 ms: reap nodes whose connection dropped or whose heartbeats stopped. */
static void cluster_tick(uv_timer_t *t)
{
    ty_conductor_t *c = t->data;
    uint64_t now = ty_clock_ms();
    for (size_t i = 0; i < c->n_nodes; i++) {
        struct ty__cnode *n = c->nodes[i];
        if (n->lost)
            ty__conductor_node_down(c, n, "connection lost");
        else if (n->info.alive && now - n->last_hb_ms > c->o.heartbeat_timeout_ms)
            ty__conductor_node_down(c, n, "heartbeat timeout");
    }
    ty__breaker_tick(c, now);
    ty__conductor_retry_waiting(c);
    ty__pool_tick(c);
    uint64_t af = ty_auth_failures();
    ty_metrics_counter_follow(c->auth_failures, af, &c->auth_seen);
}

int ty__conductor_registry_start(ty_conductor_t *c)
{
    /* 64 MiB frames: a prefill node's reset snapshot lists every cached block (8 bytes and a
     * tag each), a few million blocks on a large node */
    struct ty_rpc_server_opts so = {.loop = c->o.loop, .host = c->o.rpc_host,
                                    .port = c->o.rpc_port, .max_frame_size = 64u << 20,
                                    .auth = c->o.auth};
    int rc = ty_rpc_server_new(&c->srv, &so);
    if (rc)
        return rc;
    node_metrics_init(c);
    ty_rpc_server_handle_msg(c->srv, TYCHO__V1__METHOD__METHOD_REGISTER_NODE,
                             &tycho__v1__register_node__descriptor, on_register, c);
    ty_rpc_server_handle_msg(c->srv, TYCHO__V1__METHOD__METHOD_HEARTBEAT,
                             &tycho__v1__heartbeat__descriptor, on_heartbeat, c);
    uv_timer_init(c->o.loop, &c->tick);
    c->tick.data = c;
    uv_timer_start(&c->tick, cluster_tick, 100, 100);
    return 0;
}

uint16_t ty_conductor_rpc_port(const ty_conductor_t *c)
{
    return ty_rpc_server_port(c->srv);
}

size_t ty_conductor_nodes(const ty_conductor_t *c, struct ty_conductor_node_info *out, size_t cap)
{
    for (size_t i = 0; i < c->n_nodes && i < cap; i++)
        out[i] = c->nodes[i]->info;
    return c->n_nodes;
}
