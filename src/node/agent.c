/* The node agent (tycho/node.h): with each Conductor of conductor_address (a comma-separated
 * list: Conductors that run side by side behind a load balancer), a session: RegisterNode
 * until accepted, then one Heartbeat per interval with the node's load, its timing samples and
 * its KV block events; registers again when that Conductor answers known=false (it restarted
 * or declared us dead) or after the connection came back. Sessions are independent: one
 * Conductor's death or restart leaves the others' registrations alone. Each session has its
 * own KV event set (the first the caller's, the others followers of it: ty_kv_events_follow),
 * so each Conductor learns every block; timing samples go to whichever heartbeat takes them.
 * One call in flight per session, so a slow Conductor never piles up heartbeats, and block
 * event batches reach it in the order they were taken. */
#include "tycho/node.h"
#include "tycho/proto.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/rpc.h"
#include "tycho.pb-c.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define MAX_CONDUCTORS 8

/* One Conductor's session */
struct csess {
    ty_node_agent_t *agent;
    char *conductor;
    ty_rpc_client_t *rpc;
    uv_timer_t timer;
    bool registered, in_flight;
    uint64_t session, seq;
    uint32_t interval_ms;
    ty_kv_events_t *kv_events;       /* this Conductor's view of the node's blocks */
    bool own_events;                 /* a follower made here (freed with the agent) */
    struct ty_kv_events_batch batch; /* in the heartbeat in flight (batch_out) */
    bool batch_out;
};

struct ty_node_agent {
    struct ty_node_agent_opts o;
    uint8_t instance[16]; /* random: this process's claim on node_id */
    char *node_id, *address, *segment, *model_id;
    struct csess s[MAX_CONDUCTORS];
    int n_sess;
    void (*close_cb)(void *);
    void *close_arg;
    int n_closing;
};

bool ty_node_agent_registered(const ty_node_agent_t *a)
{
    for (int i = 0; i < a->n_sess; i++)
        if (a->s[i].registered)
            return true;
    return false;
}

static void on_register_reply(const struct ty_rpc_result *res, void *arg)
{
    struct csess *a = arg;
    a->in_flight = false;
    if (res->event != TY_RPC_EVENT_REPLY) {
        if (res->status != TY_ECANCELED)
            TY_LOG_DEBUG("agent", "register: %s", ty_strerror(res->status));
        return;
    }
    Tycho__V1__RegisterNodeReply *r =
        tycho__v1__register_node_reply__unpack(NULL, res->len, res->payload);
    if (!r) {
        TY_LOG_WARN("agent", "register: undecodable reply");
        return;
    }
    if (r->accepted) {
        a->registered = true;
        if (a->kv_events) /* a new session: the Conductor holds none of our blocks */
            ty_kv_events_resync(a->kv_events);
        a->session = r->session_id;
        if (r->heartbeat_interval_ms)
            a->interval_ms = r->heartbeat_interval_ms;
        TY_LOG_INFO("agent", "registered with the Conductor at %s as %s (session %llu)",
                    a->conductor, a->agent->node_id, (unsigned long long)a->session);
    } else {
        TY_LOG_ERROR("agent", "the Conductor at %s refused %s: %s", a->conductor,
                     a->agent->node_id, r->reason);
    }
    tycho__v1__register_node_reply__free_unpacked(r, NULL);
}

static void send_register(struct csess *cs)
{
    ty_node_agent_t *a = cs->agent;
    const struct ty_model_config *mc = ty_model_config(a->o.model);
    Tycho__V1__ModelFingerprint fp = TYCHO__V1__MODEL_FINGERPRINT__INIT;
    fp.model_id = a->model_id;
    fp.dtype = (char *)(a->o.kv_dtype ? a->o.kv_dtype : "f32");
    fp.n_layers = mc->n_layers;
    fp.n_kv_heads = mc->n_kv_heads;
    fp.head_dim = mc->head_dim;
    Tycho__V1__Capacity cap = TYCHO__V1__CAPACITY__INIT;
    cap.kv_pages = a->o.kv_pages;
    cap.block_tokens = a->o.block_tokens;
    cap.max_batch = a->o.max_batch;
    cap.max_batch_prompts = a->o.max_batch_prompts;
    cap.max_ctx = a->o.max_ctx;
    cap.interleaves = a->o.interleaves;
    static const char *const tcp_only[] = {"tcp"};
    Tycho__V1__RegisterNode m = TYCHO__V1__REGISTER_NODE__INIT;
    m.protocol_version = TYCHO__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    m.role = (Tycho__V1__NodeRole)a->o.role;
    m.node_id = a->node_id;
    m.address = a->address;
    m.transfer_segment = a->segment;
    m.capacity = &cap;
    m.model = &fp;
    m.n_transports = a->o.n_transports ? a->o.n_transports : 1;
    m.transports = (char **)(a->o.n_transports ? a->o.transports : tcp_only);
    m.backend = (char *)(a->o.backend ? a->o.backend : "cpu");
    m.kv_device = (char *)(a->o.kv_device ? a->o.kv_device : "cpu");
    m.instance.data = a->instance;
    m.instance.len = sizeof(a->instance);
    struct ty_rpc_call_opts co = {.timeout_ms = 2000};
    if (!ty_rpc_client_call_msg(cs->rpc, TYCHO__V1__METHOD__METHOD_REGISTER_NODE,
                                (const ProtobufCMessage *)&m, &co, on_register_reply, cs, NULL))
        cs->in_flight = true;
}

/* The heartbeat's block events: applied (known=true), lost or perhaps lost (given back), or
 * addressed to a Conductor that forgot us (the next registration resyncs). */
static void batch_done(struct csess *a, bool applied)
{
    if (!a->batch_out)
        return;
    a->batch_out = false;
    if (applied)
        ty_kv_events_batch_clear(&a->batch);
    else
        ty_kv_events_give_back(a->kv_events, &a->batch);
}

static void on_heartbeat_reply(const struct ty_rpc_result *res, void *arg)
{
    struct csess *a = arg;
    a->in_flight = false;
    Tycho__V1__HeartbeatReply *r =
        res->event == TY_RPC_EVENT_REPLY
            ? tycho__v1__heartbeat_reply__unpack(NULL, res->len, res->payload)
            : NULL;
    batch_done(a, r != NULL); /* known=false too: registering again resyncs */
    if (r && !r->known) {
        TY_LOG_WARN("agent", "the Conductor at %s does not know %s any more: registering again",
                    a->conductor, a->agent->node_id);
        a->registered = false;
    }
    if (r)
        tycho__v1__heartbeat_reply__free_unpacked(r, NULL);
}

/* The block events of this heartbeat into *pb (a batch taken and held until the reply); false
 * when there is nothing to send. */
static bool take_kv_events(struct csess *a, Tycho__V1__KvBlockEvents *pb)
{
    if (!a->kv_events || ty_kv_events_take(a->kv_events, &a->batch))
        return false; /* TY_ENOMEM: the changes stay pending for the next heartbeat */
    if (ty_kv_events_batch_empty(&a->batch)) {
        ty_kv_events_batch_clear(&a->batch);
        return false;
    }
    a->batch_out = true;
    pb->reset = a->batch.reset;
    pb->n_stored = a->batch.n_stored;
    pb->stored = a->batch.stored;
    pb->n_removed = a->batch.n_removed;
    pb->removed = a->batch.removed;
    return true;
}

/* Drain the timing ring into samples / ptrs (TY_NODE_MAX_TIMINGS each); returns how many. */
static size_t take_timings(ty_node_agent_t *a, Tycho__V1__TimingSample *pb,
                           Tycho__V1__TimingSample **ptrs)
{
    struct ty_timing_sample s[TY_NODE_MAX_TIMINGS];
    size_t n = a->o.timings ? ty_timing_ring_take(a->o.timings, s, TY_NODE_MAX_TIMINGS) : 0;
    for (size_t i = 0; i < n; i++) {
        tycho__v1__timing_sample__init(&pb[i]);
        pb[i].n_tokens = s[i].n_tokens;
        pb[i].prefix_tokens = s[i].prefix_tokens;
        pb[i].batch_size = s[i].batch_size;
        pb[i].duration_us = s[i].duration_us;
        pb[i].attn_work = s[i].attn_work;
        ptrs[i] = &pb[i];
    }
    return n;
}

/* The prompts the node is computing into pb / ptrs (TY_NODE_MAX_PROGRESS each); returns how
 * many (none without a progress_cb). */
static size_t take_progress(ty_node_agent_t *a, Tycho__V1__PrefillProgress *pb,
                            Tycho__V1__PrefillProgress **ptrs)
{
    struct ty_node_progress s[TY_NODE_MAX_PROGRESS];
    size_t n = a->o.progress_cb ? a->o.progress_cb(a->o.load_arg, s, TY_NODE_MAX_PROGRESS) : 0;
    for (size_t i = 0; i < n; i++) {
        tycho__v1__prefill_progress__init(&pb[i]);
        pb[i].request_id = s[i].rid;
        pb[i].attempt = s[i].attempt;
        pb[i].tokens_done = s[i].tokens_done;
        pb[i].tokens_total = s[i].tokens_total;
        pb[i].step_us = s[i].step_us;
        pb[i].tokens_per_s = s[i].tokens_per_s;
        ptrs[i] = &pb[i];
    }
    return n;
}

static void send_heartbeat(struct csess *cs)
{
    ty_node_agent_t *a = cs->agent;
    struct ty_node_load l = {0};
    if (a->o.load_cb)
        a->o.load_cb(a->o.load_arg, &l);
    Tycho__V1__Load load = TYCHO__V1__LOAD__INIT;
    load.queued_tokens = l.queued_tokens;
    load.running_requests = l.running;
    load.queued_requests = l.queued;
    load.free_pages = l.free_pages;
    load.kv_cache_usage = l.kv_usage;
    load.kv_pool_read_blocks = l.pool_read_blocks;
    load.kv_pool_written_blocks = l.pool_written_blocks;
    load.kv_pool_errors = l.pool_errors;
    load.preemptions = l.preemptions;
    Tycho__V1__Heartbeat m = TYCHO__V1__HEARTBEAT__INIT;
    m.node_id = a->node_id;
    m.session_id = cs->session;
    m.seq = ++cs->seq;
    m.wall_ms = ty_wall_ms();
    m.load = &load;
    Tycho__V1__TimingSample ts[TY_NODE_MAX_TIMINGS], *tsp[TY_NODE_MAX_TIMINGS];
    size_t n_ts = take_timings(a, ts, tsp);
    if (a->o.role == TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL) {
        m.n_prefill_timings = n_ts;
        m.prefill_timings = tsp;
    } else {
        m.n_decode_timings = n_ts;
        m.decode_timings = tsp;
    }
    Tycho__V1__KvBlockEvents kv = TYCHO__V1__KV_BLOCK_EVENTS__INIT;
    if (take_kv_events(cs, &kv))
        m.kv_events = &kv;
    Tycho__V1__PrefillProgress pg[TY_NODE_MAX_PROGRESS], *pgp[TY_NODE_MAX_PROGRESS];
    m.n_prefill_progress = take_progress(a, pg, pgp);
    m.prefill_progress = pgp;
    struct ty_rpc_call_opts co = {.timeout_ms = cs->interval_ms * 4 + 500};
    int rc = ty_rpc_client_call_msg(cs->rpc, TYCHO__V1__METHOD__METHOD_HEARTBEAT,
                                    (const ProtobufCMessage *)&m, &co, on_heartbeat_reply, cs,
                                    NULL);
    if (rc) {
        TY_LOG_DEBUG("agent", "heartbeat: %s", ty_strerror(rc));
        batch_done(cs, false);
        return;
    }
    cs->in_flight = true;
}

static void on_tick(uv_timer_t *t)
{
    struct csess *a = t->data;
    if (!a->in_flight && ty_rpc_client_is_connected(a->rpc)) {
        if (a->registered)
            send_heartbeat(a);
        else
            send_register(a);
    }
    uv_timer_start(&a->timer, on_tick, a->registered ? a->interval_ms : 100, 0);
}

static void on_state(ty_rpc_client_t *c, bool connected, int reason, void *arg)
{
    struct csess *a = arg;
    (void)c;
    if (!connected) {
        if (a->registered)
            TY_LOG_WARN("agent", "lost the Conductor at %s (%s): will register again",
                        a->conductor, ty_strerror(reason));
        a->registered = false;
    }
}

/* "stories260K" from ".../stories260K.gguf". */
static char *model_id_of(const char *path)
{
    const char *base = strrchr(path, '/');
    char *id = strdup(base && base[1] ? base + 1 : path);
    char *dot = id ? strrchr(id, '.') : NULL;
    if (dot && !strcmp(dot, ".gguf"))
        *dot = 0;
    return id;
}

static void agent_free(ty_node_agent_t *a)
{
    for (int i = 0; i < a->n_sess; i++) {
        struct csess *cs = &a->s[i];
        ty_kv_events_batch_clear(&cs->batch);
        if (cs->own_events) {
            ty_kv_events_unfollow(a->o.kv_events, cs->kv_events);
            ty_kv_events_free(cs->kv_events);
        }
        free(cs->conductor);
    }
    free(a->node_id);
    free(a->address);
    free(a->segment);
    free(a->model_id);
    free(a);
}

/* Session i with the Conductor at `addr` ("host:port"): its client, its KV event set. */
static int sess_start(ty_node_agent_t *a, int i, const char *addr)
{
    struct csess *cs = &a->s[i];
    char host[256];
    uint16_t port;
    cs->agent = a;
    cs->interval_ms = a->o.heartbeat_interval_ms ? a->o.heartbeat_interval_ms : 500;
    if (ty_config_split_hostport(addr, host, sizeof(host), &port)) /* checked by the caller */
        return TY_EINVAL;
    if (!(cs->conductor = strdup(addr)))
        return TY_ENOMEM;
    if (a->o.kv_events && i == 0) {
        cs->kv_events = a->o.kv_events;
    } else if (a->o.kv_events) {
        int rc = ty_kv_events_new(&cs->kv_events, 0);
        if (!rc && (rc = ty_kv_events_follow(a->o.kv_events, cs->kv_events)))
            ty_kv_events_free(cs->kv_events);
        if (rc) {
            free(cs->conductor);
            memset(cs, 0, sizeof(*cs));
            return rc;
        }
        cs->own_events = true;
    }
    struct ty_rpc_client_opts co = {.loop = a->o.loop, .host = host, .port = port,
                                    .backoff_initial_ms = 50, .backoff_max_ms = 1000,
                                    .connect_timeout_ms = 2000, .state_cb = on_state,
                                    .state_arg = cs, .max_frame_size = 64u << 20,
                                    .auth = a->o.auth};
    int rc = ty_rpc_client_new(&cs->rpc, &co);
    if (rc) {
        if (cs->own_events) {
            ty_kv_events_unfollow(a->o.kv_events, cs->kv_events);
            ty_kv_events_free(cs->kv_events);
        }
        free(cs->conductor);
        memset(cs, 0, sizeof(*cs));
        return rc;
    }
    uv_timer_init(a->o.loop, &cs->timer);
    cs->timer.data = cs;
    return 0;
}

int ty_node_agent_new(ty_node_agent_t **out, const struct ty_node_agent_opts *opts)
{
    if (!out || !opts || !opts->loop || !opts->conductor_address || !opts->node_id ||
        !opts->address || !opts->segment || !opts->model)
        return TY_EINVAL;
    ty_node_agent_t *a = calloc(1, sizeof(*a));
    if (!a)
        return TY_ENOMEM;
    a->o = *opts;
    if (getrandom(a->instance, sizeof(a->instance), 0) != (ssize_t)sizeof(a->instance)) {
        uint64_t t = ty_clock_ns() ^ ((uint64_t)getpid() << 32); /* unique enough per host */
        memcpy(a->instance, &t, sizeof(t));
    }
    a->node_id = strdup(opts->node_id);
    a->address = strdup(opts->address);
    a->segment = strdup(opts->segment);
    a->model_id = model_id_of(opts->model_path ? opts->model_path : "model");
    int rc = a->node_id && a->address && a->segment && a->model_id ? 0 : TY_ENOMEM;
    /* the Conductors, comma-separated: all checked before any session starts */
    char list[1024], *addrs[MAX_CONDUCTORS], *save = NULL;
    int n = 0;
    snprintf(list, sizeof(list), "%s", opts->conductor_address);
    for (char *t = strtok_r(list, ", ", &save); t && !rc; t = strtok_r(NULL, ", ", &save)) {
        char host[256];
        uint16_t port;
        if (n == MAX_CONDUCTORS || ty_config_split_hostport(t, host, sizeof(host), &port)) {
            TY_LOG_ERROR("agent", "conductor_address '%s': %s", opts->conductor_address,
                         n == MAX_CONDUCTORS ? "more than 8 Conductors" : "not host:port[,...]");
            rc = TY_EINVAL;
        }
        addrs[n++] = t;
    }
    if (!rc && !n) {
        TY_LOG_ERROR("agent", "conductor_address is empty");
        rc = TY_EINVAL;
    }
    for (int i = 0; i < n && !rc; i++)
        if (!(rc = sess_start(a, i, addrs[i])))
            a->n_sess++;
    if (rc && a->n_sess) { /* sessions up already: closed as at the end (loop thread) */
        ty_node_agent_close(a, NULL, NULL);
        return rc;
    }
    if (rc) {
        agent_free(a);
        return rc;
    }
    for (int i = 0; i < a->n_sess; i++)
        uv_timer_start(&a->s[i].timer, on_tick, 0, 0);
    *out = a;
    return 0;
}

static void agent_done(ty_node_agent_t *a)
{
    if (--a->n_closing)
        return;
    void (*cb)(void *) = a->close_cb;
    void *arg = a->close_arg;
    agent_free(a);
    if (cb)
        cb(arg);
}

static void on_timer_closed(uv_handle_t *h)
{
    struct csess *cs = h->data;
    agent_done(cs->agent);
}

static void on_rpc_closed(void *arg)
{
    agent_done(arg);
}

void ty_node_agent_close(ty_node_agent_t *a, void (*cb)(void *arg), void *arg)
{
    if (!a) {
        if (cb)
            cb(arg);
        return;
    }
    a->close_cb = cb;
    a->close_arg = arg;
    a->n_closing = 2 * a->n_sess;
    for (int i = 0; i < a->n_sess; i++) {
        uv_timer_stop(&a->s[i].timer);
        uv_close((uv_handle_t *)&a->s[i].timer, on_timer_closed);
        ty_rpc_client_close(a->s[i].rpc, on_rpc_closed, a);
    }
}

/* ---- helpers shared by the daemons ------------------------------------------------------------- */

int ty_node_write_ports(const char *path, unsigned a, unsigned b, unsigned c)
{
    if (!path || !*path)
        return 0;
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -errno;
    if (c)
        fprintf(f, "%u %u %u\n", a, b, c);
    else
        fprintf(f, "%u %u\n", a, b);
    if (fclose(f) || rename(tmp, path)) {
        int e = -errno;
        unlink(tmp);
        return e;
    }
    return 0;
}

void ty_node_default_name(const char *role, char *buf, size_t cap)
{
    char host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = 0;
    snprintf(buf, cap, "%s-%s-%ld", role, host, (long)getpid());
}
