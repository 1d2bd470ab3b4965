/* The Conductor's live scheduler glue (src/conductor/placement.c) fed hand-made
 * heartbeats and requests: what a misbehaving node can and cannot do to the prefix index and
 * the cost model, the block-size rule for prefill nodes, and the credit a placement gives a
 * prefill node. A real ty_conductor_t (its RPC endpoint on an ephemeral loopback port) over
 * stories260K; nodes are registry entries made here, without processes. Skips (77) without
 * the test data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "conductor-impl.h"

#include "tycho/errors.h"
#include "tycho/hash.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ty_model_t *g_model;

struct fixture {
    uv_loop_t loop;
    ty_conductor_t *c;
};

static void on_event(void *arg, const struct ty_serve_event *ev)
{
    (void)arg;
    (void)ev;
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    assert_int_equal(uv_loop_init(&f->loop), 0);
    struct ty_conductor_opts o = {.loop = &f->loop, .rpc_host = "127.0.0.1", .model = g_model,
                                .max_ctx = 512, .event_cb = on_event};
    assert_int_equal(ty_conductor_new(&f->c, &o), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    ty_conductor_close(f->c, NULL, NULL);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    uv_loop_close(&f->loop);
    free(f);
    return 0;
}

/* A registered node as the registry would make it (no connection). */
static struct ty__cnode *node(ty_conductor_t *c, int role, uint32_t block_tokens,
                              uint64_t pages, int expect_rc)
{
    struct ty__cnode *n = calloc(1, sizeof(*n));
    assert_non_null(n);
    n->c = c;
    n->slot = (uint32_t)c->n_nodes;
    snprintf(n->info.id, sizeof(n->info.id), "n%zu", c->n_nodes);
    n->info.role = role;
    n->info.alive = true;
    n->block_tokens = block_tokens;
    n->kv_pages = pages;
    n->max_batch = 64;
    c->nodes[c->n_nodes++] = n;
    char why[256] = "";
    assert_int_equal(ty__place_node_up(c, n, why, sizeof(why)), expect_rc);
    if (expect_rc)
        assert_non_null(strstr(why, "kv_block_tokens"));
    return n;
}

static size_t index_size(ty_conductor_t *c)
{
    return ty_sched_index_size(ty_sched_index(c->place.s));
}

static void heartbeat_stored(ty_conductor_t *c, struct ty__cnode *n, uint64_t first, size_t count,
                             bool reset)
{
    uint64_t *h = malloc(count * sizeof(*h));
    assert_non_null(h);
    for (size_t i = 0; i < count; i++)
        h[i] = first + i;
    Tycho__V1__KvBlockEvents ev = TYCHO__V1__KV_BLOCK_EVENTS__INIT;
    ev.reset = reset;
    ev.n_stored = count;
    ev.stored = h;
    Tycho__V1__Heartbeat m = TYCHO__V1__HEARTBEAT__INIT;
    m.kv_events = &ev;
    ty__place_heartbeat(c, n, &m);
    free(h);
}

/* A prefill node's events fill the index up to what its pages can hold; one that reports
 * far more (a confused or hostile node) gets its entries dropped instead of growing the
 * Conductor's memory; a reset replaces the node's set. */
static void test_index_bounded_by_pages(void **state)
{
    struct fixture *f = *state;
    struct ty__cnode *p = node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, 16, 100, 0);
    heartbeat_stored(f->c, p, 1000, 100, true);
    assert_int_equal(index_size(f->c), 100);
    heartbeat_stored(f->c, p, 5000, 50, false); /* 150: within 2x its pages */
    assert_int_equal(index_size(f->c), 150);
    heartbeat_stored(f->c, p, 9000, 100000, false); /* far beyond: dropped */
    assert_int_equal(index_size(f->c), 0);
    heartbeat_stored(f->c, p, 1000, 80, true); /* its next reset restores it */
    assert_int_equal(index_size(f->c), 80);
    /* a decode node's events are not prefix-cache events */
    struct ty__cnode *d = node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE, 16, 100, 0);
    heartbeat_stored(f->c, d, 20000, 10, false);
    assert_int_equal(index_size(f->c), 80);
}

static Tycho__V1__TimingSample **samples(size_t n, uint32_t tokens, uint64_t us,
                                         Tycho__V1__TimingSample *buf)
{
    Tycho__V1__TimingSample **v = malloc(n * sizeof(*v));
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) {
        tycho__v1__timing_sample__init(&buf[i]);
        buf[i].n_tokens = tokens + (uint32_t)(i % 7) * 8;
        buf[i].batch_size = 1 + (uint32_t)(i % 5);
        buf[i].prefix_tokens = (uint32_t)(i % 3) * 16;
        buf[i].duration_us = us;
        v[i] = &buf[i];
    }
    return v;
}

/* Timing samples count only from the node of their role, at most 64 a heartbeat; a prefill
 * call shared by several prompts is not one request's prefill time and is not fitted. */
static void test_samples_by_role_and_bounded(void **state)
{
    struct fixture *f = *state;
    struct ty__cnode *p = node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, 16, 100, 0);
    struct ty__cnode *d = node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE, 16, 100, 0);
    struct ty_sched_cost before = ty_sched_opts_get(f->c->place.s)->cost;
    static Tycho__V1__TimingSample buf[1000];
    Tycho__V1__Heartbeat m = TYCHO__V1__HEARTBEAT__INIT;
    /* a prefill node sending hour-long decode steps: ignored */
    m.n_decode_timings = 200;
    m.decode_timings = samples(200, 1, 3600ull * 1000000, buf);
    ty__place_heartbeat(f->c, p, &m);
    assert_int_equal(f->c->place.decode.len, 0);
    assert_memory_equal(before.decode, ty_sched_opts_get(f->c->place.s)->cost.decode,
                        sizeof(before.decode));
    free(m.decode_timings);
    /* 1000 prefill samples in one heartbeat: 64 taken */
    Tycho__V1__Heartbeat m2 = TYCHO__V1__HEARTBEAT__INIT;
    m2.n_prefill_timings = 1000;
    m2.prefill_timings = samples(1000, 32, 2000, buf);
    for (size_t i = 0; i < 1000; i++)
        buf[i].batch_size = 1; /* one prompt per forward call */
    ty__place_heartbeat(f->c, p, &m2);
    assert_int_equal(f->c->place.prefill.len, 64);
    for (size_t i = 0; i < 1000; i++)
        buf[i].batch_size = 2 + (uint32_t)(i % 7); /* calls of several prompts: skipped */
    ty__place_heartbeat(f->c, p, &m2);
    assert_int_equal(f->c->place.prefill.len, 64);
    for (size_t i = 0; i < 1000; i++)
        buf[i].batch_size = 1;
    /* the same from the decode node: not prefill samples */
    ty__place_heartbeat(f->c, d, &m2);
    assert_int_equal(f->c->place.prefill.len, 64);
    free(m2.prefill_timings);
    const struct ty_sched_cost *now = &ty_sched_opts_get(f->c->place.s)->cost;
    for (int k = 0; k < 3; k++)
        assert_true(now->prefill[k] >= 0);
}

/* Prefix hashes depend on the block size: prefill nodes must share one. */
/* One KV layout in the cluster: a node of another page size is refused whatever its role (a
 * decode node's pages receive the prefill node's page for page), naming both layouts; one
 * with the same layout is taken. */
static void test_block_size_rule(void **state)
{
    struct fixture *f = *state;
    node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, 16, 100, 0);
    node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, 32, 100, TY_EINVAL);
    node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE, 32, 100, TY_EINVAL);
    node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE, 16, 100, 0);
    struct ty__cnode *n = f->c->nodes[2];
    n->n_layers = 4; /* the refused decode node, now with the model's geometry stated */
    char why[256] = "";
    assert_int_equal(ty__place_node_up(f->c, n, why, sizeof(why)), TY_EINVAL);
    assert_non_null(strstr(why, "f32, 32-token pages, 4 layers"));
    assert_non_null(strstr(why, "theirs f32, 16-token pages, 0 layers"));
}

static struct ty__creq *request(uint64_t rid, uint32_t n_prompt)
{
    struct ty__creq *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    r->rid = rid;
    r->n_prompt = n_prompt;
    r->prompt = malloc(n_prompt * sizeof(uint32_t));
    assert_non_null(r->prompt);
    for (uint32_t i = 0; i < n_prompt; i++)
        r->prompt[i] = 1 + (uint32_t)((rid * 7919 + i) % 400);
    r->gen.max_tokens = 8;
    return r;
}

static void request_free(struct ty__creq *r)
{
    free(r->prompt);
    free(r);
}

/* Placing a request credits its prefill node with the prompt's full blocks at once (the
 * same prompt next goes there, predicted cached); a request that fails before its prefill
 * takes the credit back, one that finished keeps it. */
static void test_placement_credit(void **state)
{
    struct fixture *f = *state;
    node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, 16, 100, 0);
    node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE, 16, 1000, 0);
    struct ty__creq *a = request(1, 100); /* 6 full blocks */
    assert_int_equal(ty__place_pick(f->c, a, NULL, false), 0);
    assert_true(a->placed);
    assert_int_equal(index_size(f->c), 6);
    ty__place_done(f->c, a, false); /* failed before its prefill */
    assert_int_equal(index_size(f->c), 0);
    assert_false(a->placed);
    struct ty__creq *b = request(1, 100); /* the same prompt */
    b->rid = 2;
    assert_int_equal(ty__place_pick(f->c, b, NULL, false), 0);
    ty__place_prefilled(f->c, b);
    ty__place_done(f->c, b, true);
    assert_int_equal(index_size(f->c), 6); /* computed there: its events speak for it now */
    uint64_t h[6];
    assert_int_equal(ty_hash_prefix_blocks(b->prompt, 100, 16, f->c->place.hash_seed, h, 6), 6);
    uint32_t prefix[2];
    ty_sched_index_match(ty_sched_index(f->c->place.s), h, 6, prefix, 2);
    assert_int_equal(prefix[0], 6); /* slot 0, the prefill node, under the nodes' hashes */
    request_free(a);
    request_free(b);
}

/* The scheduler's prefill node died before the request was sent to it and another took it
 * (remote.c): the credit leaves the first node's index entries and the request's predicted
 * work moves to the second node's queue, so a later placement sees it there. */
static void test_moved_request(void **state)
{
    struct fixture *f = *state;
    struct ty__cnode *p0 = node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, 16, 100, 0);
    struct ty__cnode *p1 = node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, 16, 100, 0);
    node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE, 16, 1000, 0);
    struct ty__creq *a = request(1, 100);
    assert_int_equal(ty__place_pick(f->c, a, NULL, false), 0);
    struct ty__cnode *chosen = a->pnode, *other = chosen == p0 ? p1 : p0;
    assert_int_equal(index_size(f->c), 6);
    assert_true(chosen->queued_prefill_us > 0 && chosen->n_queued == 1);
    double work = chosen->queued_prefill_us;
    a->pnode = other;
    ty__place_moved(f->c, a, chosen);
    assert_int_equal(index_size(f->c), 0); /* the credit is gone from the first node */
    assert_true(chosen->queued_prefill_us == 0 && chosen->n_queued == 0);
    assert_true(fabs(other->queued_prefill_us - work) < 1e-6 && other->n_queued == 1);
    assert_ptr_equal(a->queued_on, other);
    /* its prefill and end release the second node's queue, not the first's */
    ty__place_prefilled(f->c, a);
    assert_true(other->queued_prefill_us == 0 && other->n_queued == 0);
    ty__place_done(f->c, a, true);
    request_free(a);
}

/* A Conductor serving one class with a 5 ms TBT SLO (no TTFT SLO), predicted admission and a
 * decode cost model of 11 ms + 0.24 ms per sequence, refitted from the nodes' timings: what a
 * user's Conductor had learned in a burst. Probes after `probe_ns` of silence (0: none). */
static int setup_stale(void **state, uint64_t probe_ns)
{
    struct fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    assert_int_equal(uv_loop_init(&f->loop), 0);
    struct ty_sched_slo_config slo = {.class_name = "default", .tbt_ns = 5000000};
    struct ty_sched_model_config mc = {.name = "stories260K", .slo = &slo, .n_slo = 1};
    struct ty_sched_config sc = {.policy = TY_SCHED_POLICY_KVCACHE_CENTRIC,
                                 .admission = TY_SCHED_ADMIT_PREDICTED,
                                 .kvcache_balancing_threshold = 1,
                                 .decode_duration_ns = 10000000000ull, .seed = 1,
                                 .models = &mc, .n_models = 1};
    static double decode[3] = {11000, 240, 0};
    struct ty_conductor_cost_config cc = {.profile = "auto", .decode = decode, .n_decode = 3,
                                          .net_gbytes_per_s = 1, .refit = true,
                                          .refit_window = 256,
                                          .refit_max_age_ns = 10000000000ull,
                                          .probe_interval_ns = probe_ns};
    struct ty_conductor_opts o = {.loop = &f->loop, .rpc_host = "127.0.0.1", .model = g_model,
                                  .max_ctx = 512, .event_cb = on_event, .sched = &sc,
                                  .cost = &cc, .model_name = "stories260K"};
    assert_int_equal(ty_conductor_new(&f->c, &o), 0);
    *state = f;
    return 0;
}

static int setup_stale_no_probe(void **state)
{
    return setup_stale(state, 0);
}

static int setup_stale_probe(void **state)
{
    return setup_stale(state, 50000000); /* 50 ms */
}

/* A decode node's heartbeat: `running` requests, n steps of `batch` sequences (0: 1 + i % 32,
 * the spread a burst gives) taking d0 + d1 per sequence each. */
static void decode_heartbeat(ty_conductor_t *c, struct ty__cnode *d, uint32_t running, size_t n,
                             uint32_t batch, double d0, double d1)
{
    Tycho__V1__TimingSample buf[64], *v[64];
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++) {
        tycho__v1__timing_sample__init(&buf[i]);
        buf[i].batch_size = batch ? batch : 1 + (uint32_t)(i % 32);
        buf[i].prefix_tokens = 40 + (uint32_t)(i * 37 % 500); /* context: no part of the time */
        buf[i].duration_us = (uint64_t)(d0 + d1 * buf[i].batch_size);
        v[i] = &buf[i];
    }
    Tycho__V1__Load load = TYCHO__V1__LOAD__INIT;
    load.running_requests = running;
    Tycho__V1__Heartbeat m = TYCHO__V1__HEARTBEAT__INIT;
    m.load = &load;
    m.n_decode_timings = n;
    m.decode_timings = v;
    ty__place_heartbeat(c, d, &m);
}

/* The decode samples the Conductor holds came `secs` earlier than they did. */
static void age_samples(ty_conductor_t *c, double secs)
{
    struct ty__sample_ring *r = &c->place.decode;
    uint64_t by = (uint64_t)(secs * 1e6);
    for (uint32_t i = 0; i < r->cap; i++)
        r->t[i] = r->t[i] > by ? r->t[i] - by : 0;
}

/* The burst: 64 steps of 1-32 sequences at 11 ms + 0.24 ms per sequence, refitted into the
 * model in use; the cluster is idle afterwards. */
static void burst(ty_conductor_t *c, struct ty__cnode *d)
{
    decode_heartbeat(c, d, 0, 64, 0, 11000, 240);
    const double *k = ty_sched_opts_get(c->place.s)->cost.decode;
    assert_true(fabs(k[0] - 11000) < 110 && fabs(k[1] - 240) < 2.4);
}

/* A user's report replayed: after a burst the decode model said 11 ms + 0.24 ms per sequence,
 * the TBT SLO is 5 ms, the idle cluster really steps in 0.15 ms. Before, every request was
 * refused ("predicted 11.3 ms") and, refusals giving no timings, for as long as the burst's
 * samples filled the fit. Now the first request, alone on idle nodes, is admitted; one
 * arriving beside it is refused (the model still says 11 ms, alone too: no retry helps);
 * once the first one's steps come (the burst's samples a minute old by then) the model
 * follows them and the same request beside it is admitted. */
static void test_stale_model_recovers(void **state)
{
    struct fixture *f = *state;
    struct ty__cnode *p = node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, 16, 100, 0);
    struct ty__cnode *d = node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE, 16, 1000, 0);
    (void)p;
    burst(f->c, d);
    age_samples(f->c, 60);
    struct ty__creq *a = request(1, 40);
    struct ty_serve_reject rej = {.code = ""};
    assert_int_equal(ty__place_pick(f->c, a, &rej, false), 0); /* alone: admitted */
    assert_true(a->placed && a->dnode == d);
    assert_true(a->predicted_tbt_us > 5000); /* admitted although predicted over */
    struct ty__creq *b = request(2, 40);
    assert_int_equal(ty__place_pick(f->c, b, &rej, false), TY_EREJECTED);
    assert_string_equal(rej.code, "tbt_slo");
    assert_true(rej.no_retry); /* one step alone is predicted at 11.24 ms */
    assert_non_null(strstr(rej.message, "retrying will not help"));
    assert_false(b->placed);
    /* a's first steps: one sequence in 0.15 ms */
    decode_heartbeat(f->c, d, 1, 16, 1, 150, 0);
    const double *k = ty_sched_opts_get(f->c->place.s)->cost.decode;
    double step2 = ty_sched_cost_step_us(&ty_sched_opts_get(f->c->place.s)->cost, 2, 100);
    assert_true(k[0] < 1000);
    assert_true(step2 < 5000);
    assert_int_equal(f->c->place.decode.len, 16); /* the burst's samples left the fit */
    b->rid = 3;
    assert_int_equal(ty__place_pick(f->c, b, &rej, false), 0); /* beside a: admitted */
    assert_true(b->placed && b->predicted_tbt_us < 5000);
    ty__place_done(f->c, a, false);
    ty__place_done(f->c, b, false);
    request_free(a);
    request_free(b);
}

/* Refusals give no timings: a node that sent none for probe_interval (50 ms here) gets one
 * request admission refused, at most one per interval; none with refit off. */
static void test_probe_stale_model(void **state)
{
    struct fixture *f = *state;
    node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL, 16, 100, 0);
    struct ty__cnode *d = node(f->c, TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE, 16, 1000, 0);
    burst(f->c, d);
    struct ty__creq *r[6];
    for (uint64_t i = 0; i < 6; i++)
        r[i] = request(i + 1, 40);
    struct ty_serve_reject rej = {.code = ""};
    assert_int_equal(ty__place_pick(f->c, r[0], &rej, false), 0); /* alone */
    /* beside it: refused while d's samples are fresh */
    assert_int_equal(ty__place_pick(f->c, r[1], &rej, false), TY_EREJECTED);
    usleep(60000);
    assert_int_equal(ty__place_pick(f->c, r[2], &rej, false), 0); /* the probe */
    assert_int_equal(f->c->place.n_probes, 1);
    assert_true(d->last_probe_us > 0);
    assert_int_equal(ty__place_pick(f->c, r[3], &rej, false), TY_EREJECTED); /* one only */
    usleep(60000);
    assert_int_equal(ty__place_pick(f->c, r[3], &rej, false), 0); /* the next interval's */
    assert_int_equal(f->c->place.n_probes, 2);
    /* fresh samples from d: no probe is due there for another interval */
    decode_heartbeat(f->c, d, 3, 4, 3, 11000, 240);
    assert_int_equal(ty__place_pick(f->c, r[4], &rej, false), TY_EREJECTED);
    f->c->place.refit = false; /* a fixed model learns nothing from a probe */
    usleep(60000);
    assert_int_equal(ty__place_pick(f->c, r[5], &rej, false), TY_EREJECTED);
    assert_int_equal(f->c->place.n_probes, 2);
    for (int i = 0; i < 6; i++) {
        ty__place_done(f->c, r[i], false);
        request_free(r[i]);
    }
}

/* scheduler.local_prefix_only reaches the Conductor's scheduler, and a reload (SIGHUP) turns
 * peer and pool prefixes off and on again; the default (no config) has them on. */
static void test_local_prefix_only_reload(void **state)
{
    struct fixture *f = *state;
    assert_false(ty_sched_opts_get(f->c->place.s)->local_prefix_only);
    struct ty_sched_config sc = {.policy = TY_SCHED_POLICY_KVCACHE_CENTRIC,
                                 .admission = TY_SCHED_ADMIT_BASELINE,
                                 .kvcache_balancing_threshold = 1, .local_prefix_only = true};
    assert_int_equal(ty_conductor_reload_sched(f->c, &sc), 0);
    assert_true(ty_sched_opts_get(f->c->place.s)->local_prefix_only);
    sc.local_prefix_only = false;
    assert_int_equal(ty_conductor_reload_sched(f->c, &sc), 0);
    assert_false(ty_sched_opts_get(f->c->place.s)->local_prefix_only);
}

int main(void)
{
    const char *data = getenv("TYCHO_TEST_DATA");
    char path[4096], err[256];
    snprintf(path, sizeof(path), "%s/models/stories260K/stories260K.gguf",
             data && *data ? data : "../shared");
    if (ty_model_load(&g_model, path, err, sizeof(err)) != 0) {
        printf("skip: %s: %s\n", path, err);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_index_bounded_by_pages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_samples_by_role_and_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_block_size_rule, setup, teardown),
        cmocka_unit_test_setup_teardown(test_placement_credit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_moved_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_model_recovers, setup_stale_no_probe,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_probe_stale_model, setup_stale_probe, teardown),
        cmocka_unit_test_setup_teardown(test_local_prefix_only_reload, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ty_model_free(g_model);
    return rc;
}
