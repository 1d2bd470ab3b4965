/* libFuzzer target for what nodes tell the Conductor's scheduler (src/conductor/
 * placement.c): Heartbeat messages (load, KV block events, timing samples) from prefill and
 * decode nodes, interleaved with placements, finishes and failures of requests and with nodes
 * going down and coming back.
 *
 * Input: records of [op][node][len lo][len hi][len bytes]. op % 4: 0 a Heartbeat (the bytes
 * are its protobuf encoding; undecodable ones are what the RPC handler refuses, skipped here),
 * 1 place a request (the bytes are its prompt), 2 end the oldest placed request (naturally or
 * not, by node's low bit), 3 take the node down and register it again (when node's bit 1 is
 * set, a prefill node's unprefilled requests move to the other one first, as remote.c moves
 * them when a chosen node died before PrefillAssign). Each input gets a new
 * cluster of 2 prefill nodes (16-token blocks, 64 pages) and 1 decode node.
 *
 * Checked after every record: the cost model stays finite and non-negative (no heartbeat can
 * make predicted times negative or NaN), the prefix index stays within twice the prefill
 * nodes' pages plus what this input's placements credited (whatever the nodes report), and
 * the scheduler has exactly the requests this harness placed and did not end, and each
 * prefill node's queue counts exactly the requests queued on it. Needs stories260K from the
 * test data (TYCHO_TEST_DATA; by default the shared data folder beside the checkout); without
 * it every input is skipped. */
#include "conductor-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_REQS 16
#define PAGES 64

static ty_model_t *g_model;

static void check(int cond)
{
    if (!cond)
        abort();
}

static void on_event(void *arg, const struct ty_serve_event *ev)
{
    (void)arg;
    (void)ev;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *data = getenv("TYCHO_TEST_DATA");
    char path[4096], err[256];
    snprintf(path, sizeof(path), "%s/models/stories260K/stories260K.gguf",
             data && *data ? data : "../shared");
    if (ty_model_load(&g_model, path, err, sizeof(err)) != 0)
        fprintf(stderr, "fuzz_heartbeat: no model (%s: %s): every input is skipped\n", path, err);
    ty_log_set_level(TY_LOG_LEVEL_ERROR); /* a confused node is logged at WARN: not the point here */
    return 0;
}

static struct ty__cnode *add_node(ty_conductor_t *c, int role)
{
    struct ty__cnode *n = calloc(1, sizeof(*n));
    check(n != NULL);
    n->c = c;
    n->slot = (uint32_t)c->n_nodes;
    snprintf(n->info.id, sizeof(n->info.id), "n%zu", c->n_nodes);
    n->info.role = role;
    n->info.alive = true;
    n->block_tokens = 16;
    n->kv_pages = PAGES;
    n->max_batch = 8;
    c->nodes[c->n_nodes++] = n;
    char why[256];
    check(ty__place_node_up(c, n, why, sizeof(why)) == 0);
    return n;
}

static void check_invariants(ty_conductor_t *c, struct ty__creq **reqs, size_t n_reqs,
                             size_t credited)
{
    const struct ty_sched_cost *k = &ty_sched_opts_get(c->place.s)->cost;
    for (int i = 0; i < 3; i++) {
        check(isfinite(k->prefill[i]) && k->prefill[i] >= 0);
        check(isfinite(k->decode[i]) && k->decode[i] >= 0);
    }
    size_t placed = 0;
    for (size_t i = 0; i < n_reqs; i++)
        placed += reqs[i]->placed;
    check(ty_sched_index_size(ty_sched_index(c->place.s)) <= 2 * 2 * PAGES + credited);
    check(ty_sched_in_flight(c->place.s) == placed);
    /* each prefill node's queue counts exactly the requests queued on it */
    for (uint32_t j = 0; j < 2; j++) {
        const struct ty__cnode *pn = c->nodes[j];
        uint32_t queued = 0;
        for (size_t i = 0; i < n_reqs; i++)
            queued += reqs[i]->queued_on == pn;
        check(pn->n_queued == queued && pn->queued_prefill_us >= 0);
    }
}

static void req_free(struct ty__creq *r)
{
    free(r->prompt);
    free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_model)
        return 0;
    uv_loop_t loop;
    check(uv_loop_init(&loop) == 0);
    struct ty_conductor_opts o = {.loop = &loop, .rpc_host = "127.0.0.1", .model = g_model,
                                .max_ctx = 512, .event_cb = on_event};
    ty_conductor_t *c;
    check(ty_conductor_new(&c, &o) == 0);
    struct ty__cnode *nodes[3] = {add_node(c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL),
                                  add_node(c, TYCHO__V1__NODE_ROLE__NODE_ROLE_PREFILL),
                                  add_node(c, TYCHO__V1__NODE_ROLE__NODE_ROLE_DECODE)};
    struct ty__creq *reqs[MAX_REQS];
    size_t n_reqs = 0;
    uint64_t rid = 0;
    size_t off = 0, credited = 0; /* blocks placements credited (a prefill keeps them) */
    while (off + 4 <= size) {
        uint8_t op = data[off] % 4, who = data[off + 1];
        size_t len = data[off + 2] | (size_t)data[off + 3] << 8;
        off += 4;
        if (len > size - off)
            len = size - off;
        const uint8_t *p = data + off;
        off += len;
        struct ty__cnode *n = nodes[who % 3];
        if (op == 0) {
            Tycho__V1__Heartbeat *m = tycho__v1__heartbeat__unpack(NULL, len, p);
            if (m) {
                ty__place_heartbeat(c, n, m);
                tycho__v1__heartbeat__free_unpacked(m, NULL);
            }
        } else if (op == 1 && n_reqs < MAX_REQS && len / 2 > 0 && len / 2 < 500) {
            struct ty__creq *r = calloc(1, sizeof(*r));
            check(r != NULL);
            r->rid = ++rid;
            r->n_prompt = (uint32_t)(len / 2);
            r->prompt = malloc(r->n_prompt * sizeof(uint32_t));
            check(r->prompt != NULL);
            for (uint32_t i = 0; i < r->n_prompt; i++)
                r->prompt[i] = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) % 512;
            r->gen.max_tokens = who;
            int rc = ty__place_pick(c, r, NULL, false);
            check(rc == 0 || rc == TY_EUNAVAIL || rc == TY_EREJECTED);
            credited += r->n_credit;
            if (rc == 0 && len % 3 == 0)
                ty__place_prefilled(c, r);
            if (rc == 0) {
                reqs[n_reqs++] = r;
            } else {
                check(!r->placed && !r->credit);
                req_free(r);
            }
        } else if (op == 2 && n_reqs) {
            ty__place_done(c, reqs[0], who & 1);
            check(!reqs[0]->placed && !reqs[0]->credit);
            req_free(reqs[0]);
            memmove(reqs, reqs + 1, --n_reqs * sizeof(*reqs));
        } else if (op == 3) {
            ty__place_node_down(c, n);
            /* as remote.c does when a chosen prefill node died before PrefillAssign */
            for (size_t i = 0; i < n_reqs && (who & 2) && n != nodes[2]; i++) {
                if (reqs[i]->pnode == n && !reqs[i]->prefilled) {
                    reqs[i]->pnode = nodes[n == nodes[0] ? 1 : 0];
                    ty__place_moved(c, reqs[i], n);
                }
            }
            char why[256];
            check(ty__place_node_up(c, n, why, sizeof(why)) == 0);
        }
        check_invariants(c, reqs, n_reqs, credited);
    }
    for (size_t i = 0; i < n_reqs; i++) {
        ty__place_done(c, reqs[i], false);
        req_free(reqs[i]);
    }
    check(ty_sched_in_flight(c->place.s) == 0);
    ty_conductor_close(c, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    check(uv_loop_close(&loop) == 0);
    return 0;
}
