/* Failure detection by outcome: each node's circuit breaker (conductor-impl.h).
 *
 * Heartbeats say a node's process is there, not that it serves: a node whose engine hangs, or
 * whose RPC handler never answers, keeps heartbeating. So the Conductor also judges nodes by
 * what their requests do. A request a node fails (remote.c: no DecodeAssign answer within
 * node_answer_timeout, a prefill that long past its prediction, a call that ends in an error
 * the node did not mean as a refusal) counts against it; breaker_failures in a row open its
 * breaker: the scheduler stops choosing it (ty_sched_node_set_out; its prefix index and
 * requests in flight stay). After breaker_open the breaker turns half open and the next
 * request placed there is its probe; the probe's success closes the breaker, its failure opens
 * it again for twice as long (at most 16 times breaker_open). Any request the node answers
 * resets its count. A node that registers again starts closed. */
#include "conductor-impl.h"

#include "tycho/clock.h"
#include "tycho/log.h"

const char *ty_conductor_breaker_name(int state)
{
    switch (state) {
    case TY_BREAKER_OPEN: return "open";
    case TY_BREAKER_HALF_OPEN: return "half_open";
    default: return "closed";
    }
}

static void sched_out(ty_conductor_t *c, struct ty__cnode *n, bool out)
{
    if (n->in_sched)
        ty_sched_node_set_out(c->place.s, n->slot, out);
}

bool ty__breaker_allows(const struct ty__cnode *n)
{
    return n->info.breaker == TY_BREAKER_CLOSED ||
           (n->info.breaker == TY_BREAKER_HALF_OPEN && !n->probing);
}

static void set_state(ty_conductor_t *c, struct ty__cnode *n, int state)
{
    n->info.breaker = state;
    sched_out(c, n, !ty__breaker_allows(n));
    if (n->m_breaker)
        ty_metrics_gauge_set(n->m_breaker, state);
}

void ty__breaker_reset(ty_conductor_t *c, struct ty__cnode *n)
{
    n->info.failures = 0;
    n->probing = false;
    n->open_ms = 0;
    set_state(c, n, TY_BREAKER_CLOSED);
}

void ty__breaker_placed(ty_conductor_t *c, struct ty__cnode *n)
{
    if (!n || n->info.breaker != TY_BREAKER_HALF_OPEN || n->probing)
        return;
    n->probing = true;
    sched_out(c, n, true);
    TY_LOG_INFO("cluster", "node %s: a request probes it (circuit breaker half open)", n->info.id);
}

void ty__breaker_ok(ty_conductor_t *c, struct ty__cnode *n)
{
    n->info.failures = 0;
    if (n->info.breaker == TY_BREAKER_CLOSED)
        return;
    n->probing = false;
    n->open_ms = 0;
    set_state(c, n, TY_BREAKER_CLOSED);
    TY_LOG_WARN("cluster", "node %s answered its probe: back in placement (circuit breaker "
                "closed)", n->info.id);
}

static void open_breaker(ty_conductor_t *c, struct ty__cnode *n, const char *what)
{
    uint32_t base = c->o.breaker_open_ms;
    n->open_ms = !n->open_ms ? base : n->open_ms >= 8 * base ? 16 * base : 2 * n->open_ms;
    n->open_until_ms = ty_clock_ms() + n->open_ms;
    n->probing = false;
    set_state(c, n, TY_BREAKER_OPEN);
    TY_LOG_WARN("cluster", "node %s is out of placement for %u ms (circuit breaker open): %u "
                "request%s failed in a row, the last: %s", n->info.id, n->open_ms,
                n->info.failures, n->info.failures == 1 ? "" : "s", what);
}

void ty__breaker_failed(ty_conductor_t *c, struct ty__cnode *n, const char *what)
{
    n->info.failures++;
    if (n->m_failed)
        ty_metrics_counter_inc(n->m_failed);
    TY_LOG_WARN("cluster", "node %s failed a request (%u in a row): %s", n->info.id,
                n->info.failures, what);
    if (n->info.breaker == TY_BREAKER_HALF_OPEN ||
        (n->info.breaker == TY_BREAKER_CLOSED && n->info.failures >= c->o.breaker_failures))
        open_breaker(c, n, what);
}

void ty__breaker_avoid(ty_conductor_t *c, struct ty__cnode *n, bool hold)
{
    if (n)
        sched_out(c, n, hold || !ty__breaker_allows(n));
}

void ty__breaker_tick(ty_conductor_t *c, uint64_t now_ms)
{
    for (size_t i = 0; i < c->n_nodes; i++) {
        struct ty__cnode *n = c->nodes[i];
        if (n->info.breaker == TY_BREAKER_OPEN && now_ms >= n->open_until_ms && n->info.alive) {
            set_state(c, n, TY_BREAKER_HALF_OPEN);
            TY_LOG_INFO("cluster", "node %s: circuit breaker half open, the next request placed "
                        "there probes it", n->info.id);
        }
    }
}
