/* Hidden states between the pipeline stages of a prefill group (stage-impl.h). Why RPC and
 * not the transfer engine: the rows are per chunk, small beside the KV (dim floats a token
 * against 2 x layers x kv dim), consumed by the receiving worker in order and copied into the
 * batcher's request anyway; the RPC connection gives ordering, the cluster secret and a reply
 * per message with no destination memory to register, reserve or fence, and the prefill node
 * already keeps RPC clients to its peers. */
#include "stage-impl.h"
#include "peers-impl.h"

#include "tycho/clock.h"
#include "tycho/config.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho.pb-c.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MSG_BYTES (4u << 20)      /* rows per StageHidden, at most (frames are 8 MiB) */
#define EARLY_MS 30000            /* rows of a request not (yet) known are kept this long */
#define KEPT_BYTES (512ull << 20) /* rows kept in all, at most */

/* Rows of one request received and not yet taken. */
struct rows {
    struct rows *next;
    uint64_t rid, t_ms;
    uint32_t attempt, first, n;
    float data[]; /* (n, dim) */
};

struct ty__stage_hub {
    struct ty__stage_hub_opts o;
    ty_rpc_mailbox_t *mb;
    pthread_mutex_t mu;
    struct rows *in, **in_tail; /* under mu, arrival order */
    uint64_t kept_bytes;        /* under mu */
    struct ty__peers next; /* loop: clients to the next stages' nodes */
    bool closed;      /* loop */
    _Atomic uint64_t send_failures;
};

/* One send for the loop. */
struct out {
    ty__stage_hub_t *h;
    char addr[128];
    uint64_t rid;
    uint32_t attempt, first, n;
    float data[];
};

int ty__stage_hub_new(ty__stage_hub_t **out, const struct ty__stage_hub_opts *o)
{
    if (!o->loop || !o->dim || !o->wake)
        return TY_EINVAL;
    ty__stage_hub_t *h = calloc(1, sizeof(*h));
    if (!h)
        return TY_ENOMEM;
    h->o = *o;
    h->next = (struct ty__peers){.loop = o->loop, .auth = o->auth, .connect_timeout_ms = 2000};
    h->in_tail = &h->in;
    pthread_mutex_init(&h->mu, NULL);
    *out = h;
    return 0;
}

void ty__stage_hub_set_mailbox(ty__stage_hub_t *h, ty_rpc_mailbox_t *mb)
{
    h->mb = mb;
}

void ty__stage_hub_close(ty__stage_hub_t *h)
{
    h->closed = true;
    ty__peers_close(&h->next);
}

void ty__stage_hub_free(ty__stage_hub_t *h)
{
    if (!h)
        return;
    for (struct rows *r = h->in, *n; r; r = n) {
        n = r->next;
        free(r);
    }
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* Drop rows kept past EARLY_MS (their request never came, or ended without taking them). */
static void expire_locked(ty__stage_hub_t *h, uint64_t now)
{
    for (struct rows **pp = &h->in; *pp;) {
        struct rows *r = *pp;
        if (now - r->t_ms <= EARLY_MS) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        h->kept_bytes -= (uint64_t)r->n * h->o.dim * sizeof(float);
        free(r);
    }
    h->in_tail = &h->in;
    while (*h->in_tail)
        h->in_tail = &(*h->in_tail)->next;
}

void ty__stage_hub_receive(ty__stage_hub_t *h, ty_rpc_call_t *call, const void *msg)
{
    const Tycho__V1__StageHidden *m = msg;
    size_t bytes = (size_t)m->n_tokens * h->o.dim * sizeof(float);
    if (m->dim != h->o.dim || !m->n_tokens || m->rows.len != bytes) {
        ty_rpc_call_fail(call, TY_EINVAL, "StageHidden: %u tokens of dim %u in %zu bytes (this "
                         "node's model has dim %u)", m->n_tokens, m->dim, m->rows.len, h->o.dim);
        return;
    }
    struct rows *r = malloc(sizeof(*r) + bytes);
    if (!r) {
        ty_rpc_call_fail(call, TY_ENOMEM, "StageHidden: out of memory");
        return;
    }
    *r = (struct rows){.rid = m->request_id, .t_ms = ty_clock_ms(),
                       .attempt = m->attempt ? m->attempt : 1, .first = m->first_token,
                       .n = m->n_tokens};
    memcpy(r->data, m->rows.data, bytes);
    pthread_mutex_lock(&h->mu);
    expire_locked(h, r->t_ms);
    bool full = h->kept_bytes + bytes > KEPT_BYTES;
    if (!full) {
        *h->in_tail = r;
        h->in_tail = &r->next;
        h->kept_bytes += bytes;
    }
    pthread_mutex_unlock(&h->mu);
    if (full) {
        free(r);
        ty_rpc_call_fail(call, TY_ENOCAPACITY, "StageHidden: %llu bytes of hidden states kept "
                         "already", (unsigned long long)KEPT_BYTES);
        return;
    }
    h->o.wake(h->o.wake_arg);
    Tycho__V1__Ack a = TYCHO__V1__ACK__INIT;
    a.request_id = m->request_id;
    ty_rpc_call_reply_msg(call, &a.base);
}

/* Unlink and return rid's rows of `attempt` from the inbox, in arrival order (others of rid:
 * a stale attempt's, dropped). */
static struct rows *take_locked(ty__stage_hub_t *h, uint64_t rid, uint32_t attempt)
{
    struct rows *got = NULL, **tail = &got;
    for (struct rows **pp = &h->in; *pp;) {
        struct rows *r = *pp;
        if (r->rid != rid) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        h->kept_bytes -= (uint64_t)r->n * h->o.dim * sizeof(float);
        r->next = NULL;
        if (r->attempt == attempt) {
            *tail = r;
            tail = &r->next;
        } else {
            free(r);
        }
    }
    h->in_tail = &h->in;
    while (*h->in_tail)
        h->in_tail = &(*h->in_tail)->next;
    return got;
}

int ty__stage_hub_take(ty__stage_hub_t *h, uint64_t rid, uint32_t attempt, uint32_t *next,
                       int (*feed)(void *arg, const float *rows, uint32_t first, uint32_t n),
                       void *arg)
{
    pthread_mutex_lock(&h->mu);
    struct rows *got = h->in ? take_locked(h, rid, attempt ? attempt : 1) : NULL;
    pthread_mutex_unlock(&h->mu);
    int rc = 0;
    for (struct rows *r = got, *n; r; r = n) {
        n = r->next;
        if (!rc && r->first != *next)
            rc = TY_EPROTO;
        if (!rc && !(rc = feed(arg, r->data, r->first, r->n)))
            *next += r->n;
        free(r);
    }
    return rc;
}

void ty__stage_hub_forget(ty__stage_hub_t *h, uint64_t rid)
{
    pthread_mutex_lock(&h->mu);
    if (h->in)
        take_locked(h, rid, 0); /* attempt 0 matches no row: every one of rid is dropped */
    pthread_mutex_unlock(&h->mu);
}

static void on_sent(const struct ty_rpc_result *res, void *arg)
{
    ty__stage_hub_t *h = arg;
    if (res->event == TY_RPC_EVENT_REPLY)
        return;
    atomic_fetch_add(&h->send_failures, 1);
    TY_LOG_WARN("prefill", "hidden states not taken by the next stage: %s%s%s",
                ty_strerror(res->status), res->message[0] ? ": " : "", res->message);
}

/* Loop: one StageHidden call (the next stage's failure shows in its own PrefillAssign). */
static void on_send_post(void *arg)
{
    struct out *o = arg;
    ty__stage_hub_t *h = o->h;
    ty_rpc_client_t *c = h->closed ? NULL : ty__peers_get(&h->next, o->addr);
    Tycho__V1__StageHidden m = TYCHO__V1__STAGE_HIDDEN__INIT;
    m.request_id = o->rid;
    m.attempt = o->attempt;
    m.first_token = o->first;
    m.n_tokens = o->n;
    m.dim = h->o.dim;
    m.rows.data = (uint8_t *)o->data;
    m.rows.len = (size_t)o->n * h->o.dim * sizeof(float);
    struct ty_rpc_call_opts co = {.timeout_ms = 30000};
    if (!c || ty_rpc_client_call_msg(c, TYCHO__V1__METHOD__METHOD_STAGE_HIDDEN, &m.base, &co,
                                     on_sent, h, NULL)) {
        atomic_fetch_add(&h->send_failures, 1);
        TY_LOG_WARN("prefill", "request %llu: hidden states for %s not sent",
                    (unsigned long long)o->rid, o->addr);
    }
    free(o);
}

int ty__stage_hub_send(ty__stage_hub_t *h, const char *addr, uint64_t rid, uint32_t attempt,
                       const float *rows, uint32_t first, uint32_t n)
{
    size_t row_bytes = (size_t)h->o.dim * sizeof(float);
    uint32_t per = MSG_BYTES / row_bytes ? (uint32_t)(MSG_BYTES / row_bytes) : 1;
    for (uint32_t at = 0; at < n; at += per) {
        uint32_t k = n - at < per ? n - at : per;
        struct out *o = malloc(sizeof(*o) + k * row_bytes);
        if (!o)
            return TY_ENOMEM;
        *o = (struct out){.h = h, .rid = rid, .attempt = attempt, .first = first + at, .n = k};
        snprintf(o->addr, sizeof(o->addr), "%s", addr);
        memcpy(o->data, rows + (size_t)at * h->o.dim, k * row_bytes);
        int rc = h->mb ? ty_rpc_mailbox_post(h->mb, on_send_post, o) : TY_ESHUTDOWN;
        if (rc) {
            free(o);
            return rc;
        }
    }
    return 0;
}

uint64_t ty__stage_hub_send_failures(const ty__stage_hub_t *h)
{
    return atomic_load(&((ty__stage_hub_t *)h)->send_failures);
}
