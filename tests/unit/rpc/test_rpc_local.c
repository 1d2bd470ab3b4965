/* Client and server on one loop over real loopback TCP: unary, streams, remote errors, typed
 * handlers, timeouts (and the cancel frame they send), queued calls, refused connections with
 * backoff, close semantics, malformed input on a raw socket, and the mailbox from other
 * threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/rpc.h"
#include "tycho.pb-c.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { M_ECHO = 1000, M_STREAM = 1001, M_HOLD = 1002, M_FAIL = 1003, M_PING = 1004 };

struct fixture {
    uv_loop_t loop;
    ty_rpc_server_t *srv;
    ty_rpc_client_t *cli;
    ty_rpc_call_t *held[8]; /* the calls M_HOLD keeps open */
    int n_held;
    int held_cancel_reason;
    int held_cancels;
    ty_rpc_call_t *ping_call; /* M_PING with nonce 0: answered later by the test */
    const Tycho__V1__Ping *ping_msg;
};

/* One call's outcome as the client saw it. */
struct outcome {
    int finals;
    int items;
    int event;
    int status;
    int remote_code;
    char message[128];
    uint32_t next_item; /* stream items must arrive 0, 1, 2, ... */
    bool order_ok;
    char reply[64];
};

static void on_result(const struct ty_rpc_result *r, void *arg)
{
    struct outcome *o = arg;
    if (r->event == TY_RPC_EVENT_ITEM) {
        uint32_t v;
        assert_int_equal(r->len, 4);
        memcpy(&v, r->payload, 4);
        if (v != o->next_item)
            o->order_ok = false;
        o->next_item++;
        o->items++;
        return;
    }
    o->finals++;
    o->event = r->event;
    o->status = r->status;
    o->remote_code = r->remote_code;
    snprintf(o->message, sizeof(o->message), "%s", r->message);
    if (r->event == TY_RPC_EVENT_REPLY && r->len < sizeof(o->reply)) {
        memcpy(o->reply, r->payload, r->len);
        o->reply[r->len] = 0;
    }
}

static void h_echo(ty_rpc_call_t *call, const uint8_t *p, size_t len, void *arg)
{
    ty_rpc_call_reply(call, p, len);
}

static void h_stream(ty_rpc_call_t *call, const uint8_t *p, size_t len, void *arg)
{
    uint32_t n = 0;
    if (len != 4) {
        ty_rpc_call_fail(call, TY_EINVAL, "want a u32 count");
        return;
    }
    memcpy(&n, p, 4);
    for (uint32_t i = 0; i < n; i++)
        ty_rpc_call_stream(call, (const uint8_t *)&i, 4);
    ty_rpc_call_end(call);
}

static void on_held_cancel(ty_rpc_call_t *call, int reason, void *arg)
{
    struct fixture *fx = arg;
    fx->held_cancel_reason = reason;
    fx->held_cancels++;
}

static void h_hold(ty_rpc_call_t *call, const uint8_t *p, size_t len, void *arg)
{
    struct fixture *fx = arg;
    assert_true(fx->n_held < 8);
    fx->held[fx->n_held++] = call;
    ty_rpc_call_set_cancel_cb(call, on_held_cancel, fx);
}

static void h_fail(ty_rpc_call_t *call, const uint8_t *p, size_t len, void *arg)
{
    ty_rpc_call_fail(call, TY_ENOCAPACITY, "full: %d pages", 7);
}

/* Typed handler: answers nonce + 1 with the same data, or keeps the call (and its message)
 * when the nonce is 0. */
static void h_ping(ty_rpc_call_t *call, const void *msg, void *arg)
{
    struct fixture *fx = arg;
    const Tycho__V1__Ping *p = msg;
    if (p->nonce == 0) {
        fx->ping_call = call;
        fx->ping_msg = p;
        return;
    }
    Tycho__V1__Ping r = TYCHO__V1__PING__INIT;
    r.nonce = p->nonce + 1;
    r.data = p->data;
    ty_rpc_call_reply_msg(call, &r.base);
}

static void tick(uv_timer_t *t)
{
}

/* Run the loop until *flag reaches `want` or `ms` pass. The flag is read with acquire: a
 * helper thread (raw_sender) sets its flag with a release store after writing its results. */
static bool run_until(uv_loop_t *loop, const int *flag, int want, uint64_t ms)
{
    uv_timer_t t;
    uv_timer_init(loop, &t);
    uv_timer_start(&t, tick, 5, 5);
    uint64_t end = ty_clock_ms() + ms;
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < want && ty_clock_ms() < end)
        uv_run(loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return __atomic_load_n(flag, __ATOMIC_ACQUIRE) >= want;
}

static void run_for(uv_loop_t *loop, uint64_t ms)
{
    int never = 0;
    run_until(loop, &never, 1, ms);
}

static int setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof(*fx));
    uv_loop_init(&fx->loop);
    struct ty_rpc_server_opts so = {
        .loop = &fx->loop, .host = "127.0.0.1", .port = 0, .max_frame_size = 4096};
    assert_int_equal(ty_rpc_server_new(&fx->srv, &so), 0);
    assert_true(ty_rpc_server_port(fx->srv) != 0);
    ty_rpc_server_handle(fx->srv, M_ECHO, h_echo, fx);
    ty_rpc_server_handle(fx->srv, M_STREAM, h_stream, fx);
    ty_rpc_server_handle(fx->srv, M_HOLD, h_hold, fx);
    ty_rpc_server_handle(fx->srv, M_FAIL, h_fail, fx);
    ty_rpc_server_handle_msg(fx->srv, M_PING, &tycho__v1__ping__descriptor, h_ping, fx);
    struct ty_rpc_client_opts co = {.loop = &fx->loop,
                                    .host = "127.0.0.1",
                                    .port = ty_rpc_server_port(fx->srv),
                                    .max_frame_size = 4096,
                                    .backoff_initial_ms = 10,
                                    .backoff_max_ms = 40};
    assert_int_equal(ty_rpc_client_new(&fx->cli, &co), 0);
    *state = fx;
    return 0;
}

static void on_closed_flag(void *arg)
{
    (*(int *)arg)++;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    int closed = 0;
    for (int i = 0; i < fx->n_held; i++)
        if (fx->held[i])
            ty_rpc_call_end(fx->held[i]);
    if (fx->cli)
        ty_rpc_client_close(fx->cli, on_closed_flag, &closed);
    else
        closed++;
    if (fx->srv)
        ty_rpc_server_close(fx->srv, on_closed_flag, &closed);
    else
        closed++;
    run_until(&fx->loop, &closed, 2, 2000);
    assert_int_equal(closed, 2);
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
    free(fx);
    return 0;
}

static void test_unary_and_queued_before_connect(void **state)
{
    struct fixture *fx = *state;
    struct outcome o = {.order_ok = true};
    /* the client is still connecting: the call is queued, then sent */
    assert_false(ty_rpc_client_is_connected(fx->cli));
    uint64_t id = 0;
    assert_int_equal(
        ty_rpc_client_call(fx->cli, M_ECHO, (const uint8_t *)"abc", 3, NULL, on_result, &o, &id),
        0);
    assert_true(id != 0);
    assert_int_equal(o.finals, 0); /* never synchronously */
    assert_true(run_until(&fx->loop, &o.finals, 1, 2000));
    assert_int_equal(o.event, TY_RPC_EVENT_REPLY);
    assert_string_equal(o.reply, "abc");
    run_for(&fx->loop, 20);
    assert_int_equal(o.finals, 1);
    assert_int_equal(ty_rpc_client_pending(fx->cli), 0);
}

static void test_stream_in_order(void **state)
{
    struct fixture *fx = *state;
    struct outcome o = {.order_ok = true};
    uint32_t n = 300;
    struct ty_rpc_call_opts opts = {.stream = true};
    assert_int_equal(
        ty_rpc_client_call(fx->cli, M_STREAM, (const uint8_t *)&n, 4, &opts, on_result, &o, NULL),
        0);
    assert_true(run_until(&fx->loop, &o.finals, 1, 2000));
    assert_int_equal(o.event, TY_RPC_EVENT_END);
    assert_int_equal(o.items, 300);
    assert_true(o.order_ok);
}

static void test_remote_errors(void **state)
{
    struct fixture *fx = *state;
    struct outcome a = {0}, b = {0}, c = {0};
    ty_rpc_client_call(fx->cli, M_FAIL, NULL, 0, NULL, on_result, &a, NULL);
    ty_rpc_client_call(fx->cli, 4242, NULL, 0, NULL, on_result, &b, NULL);
    /* a unary call to a streaming method: the server streams, the client rejects the kind */
    uint32_t n = 2;
    ty_rpc_client_call(fx->cli, M_STREAM, (const uint8_t *)&n, 4, NULL, on_result, &c, NULL);
    assert_true(run_until(&fx->loop, &c.finals, 1, 2000));
    assert_true(run_until(&fx->loop, &b.finals, 1, 2000));
    assert_int_equal(a.status, TY_EREMOTE);
    assert_int_equal(a.remote_code, TY_ENOCAPACITY);
    assert_string_equal(a.message, "full: 7 pages");
    assert_int_equal(b.status, TY_EREMOTE);
    assert_int_equal(b.remote_code, TY_ENOSYS);
    assert_int_equal(c.status, TY_EPROTO);
    run_for(&fx->loop, 20);
    assert_int_equal(a.finals + b.finals + c.finals, 3);
    assert_int_equal(ty_rpc_client_call(fx->cli, M_ECHO, NULL, 5000, NULL, on_result, &a, NULL),
                     TY_EINVAL);
    uint8_t big[5000] = {0};
    assert_int_equal(
        ty_rpc_client_call(fx->cli, M_ECHO, big, sizeof(big), NULL, on_result, &a, NULL),
        TY_EMSGSIZE);
}

/* One Ping's reply as the client saw it. */
struct ping_outcome {
    int finals;
    int status, remote_code;
    char message[128];
    uint64_t nonce;
    char data[16];
};

static void on_ping_result(const struct ty_rpc_result *r, void *arg)
{
    struct ping_outcome *o = arg;
    o->finals++;
    o->status = r->status;
    o->remote_code = r->remote_code;
    snprintf(o->message, sizeof(o->message), "%s", r->message);
    Tycho__V1__Ping *p = r->event == TY_RPC_EVENT_REPLY
                             ? tycho__v1__ping__unpack(NULL, r->len, r->payload)
                             : NULL;
    if (p) {
        o->nonce = p->nonce;
        snprintf(o->data, sizeof(o->data), "%.*s", (int)p->data.len, (const char *)p->data.data);
        tycho__v1__ping__free_unpacked(p, NULL);
    }
}

static int ping(struct fixture *fx, uint64_t nonce, const char *data, struct ping_outcome *o)
{
    Tycho__V1__Ping p = TYCHO__V1__PING__INIT;
    p.nonce = nonce;
    p.data.data = (uint8_t *)data;
    p.data.len = strlen(data);
    return ty_rpc_client_call_msg(fx->cli, M_PING, &p.base, NULL, on_ping_result, o, NULL);
}

/* ty_rpc_server_handle_msg: the handler gets the decoded message; an undecodable request is
 * answered TY_EBADMSG without reaching it; a kept message lives until the call ends. */
static void test_typed_handler(void **state)
{
    struct fixture *fx = *state;
    struct ping_outcome a = {0}, bad = {0}, later = {0};
    assert_int_equal(ping(fx, 41, "abc", &a), 0);
    const uint8_t garbage[] = {0x0a, 0xff}; /* field 1, length-delimited, truncated */
    assert_int_equal(ty_rpc_client_call(fx->cli, M_PING, garbage, sizeof(garbage), NULL,
                                        on_ping_result, &bad, NULL),
                     0);
    assert_int_equal(ping(fx, 0, "kept", &later), 0);
    assert_true(run_until(&fx->loop, &a.finals, 1, 2000));
    assert_true(run_until(&fx->loop, &bad.finals, 1, 2000));
    assert_int_equal(a.status, 0);
    assert_int_equal(a.nonce, 42);
    assert_string_equal(a.data, "abc");
    assert_int_equal(bad.status, TY_EREMOTE);
    assert_int_equal(bad.remote_code, TY_EBADMSG);
    assert_string_equal(bad.message, "undecodable Ping");
    while (!fx->ping_call)
        uv_run(&fx->loop, UV_RUN_ONCE);
    run_for(&fx->loop, 20); /* the handler returned long ago: its message is still the call's */
    assert_int_equal(later.finals, 0);
    assert_int_equal(fx->ping_msg->data.len, 4);
    assert_memory_equal(fx->ping_msg->data.data, "kept", 4);
    Tycho__V1__Ping r = TYCHO__V1__PING__INIT;
    r.nonce = 7;
    r.data = fx->ping_msg->data;
    assert_int_equal(ty_rpc_call_reply_msg(fx->ping_call, &r.base), 0); /* frees the message */
    fx->ping_call = NULL;
    assert_true(run_until(&fx->loop, &later.finals, 1, 2000));
    assert_int_equal(later.nonce, 7);
    assert_string_equal(later.data, "kept");
}

static void test_timeout_exactly_once(void **state)
{
    struct fixture *fx = *state;
    struct outcome o = {0}, ok = {0};
    struct ty_rpc_call_opts t = {.timeout_ms = 80};
    uint64_t t0 = ty_clock_ms();
    ty_rpc_client_call(fx->cli, M_HOLD, NULL, 0, &t, on_result, &o, NULL);
    ty_rpc_client_call(fx->cli, M_ECHO, (const uint8_t *)"x", 1, &t, on_result, &ok, NULL);
    assert_true(run_until(&fx->loop, &o.finals, 1, 2000));
    uint64_t took = ty_clock_ms() - t0;
    assert_int_equal(o.status, TY_ETIMEDOUT);
    assert_true(took >= 75 && took < 1000);
    assert_int_equal(ok.event, TY_RPC_EVENT_REPLY);
    /* the server learns about it (best-effort cancel frame): the call's cancel callback runs
     * with TY_ECANCELED, a late reply is not sent (TY_ENOTCONN) and still ends the call */
    assert_true(run_until(&fx->loop, &fx->held_cancels, 1, 2000));
    assert_int_equal(fx->held_cancel_reason, TY_ECANCELED);
    assert_int_equal(ty_rpc_call_reply(fx->held[0], (const uint8_t *)"late", 4), TY_ENOTCONN);
    fx->held[0] = NULL;
    run_for(&fx->loop, 50);
    assert_int_equal(o.finals, 1);
    struct ty_rpc_client_stats st;
    ty_rpc_client_stats(fx->cli, &st);
    assert_int_equal(st.calls_timed_out, 1);
}

static void test_client_close_cancels_pending(void **state)
{
    struct fixture *fx = *state;
    struct outcome o[5] = {{0}};
    for (int i = 0; i < 5; i++)
        ty_rpc_client_call(fx->cli, M_HOLD, NULL, 0, NULL, on_result, &o[i], NULL);
    run_for(&fx->loop, 30);
    int closed = 0;
    ty_rpc_client_close(fx->cli, on_closed_flag, &closed);
    fx->cli = NULL;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(o[i].finals, 1);
        assert_int_equal(o[i].status, TY_ECANCELED);
    }
    assert_true(run_until(&fx->loop, &closed, 1, 2000));
    /* the server side saw the connection go: the held call got its cancel callback */
    assert_true(run_until(&fx->loop, &fx->held_cancels, 5, 2000));
    assert_int_equal(fx->held_cancel_reason, TY_ECONNRESET);
}

static void test_server_close_fails_calls(void **state)
{
    struct fixture *fx = *state;
    struct outcome o = {0};
    ty_rpc_client_call(fx->cli, M_HOLD, NULL, 0, NULL, on_result, &o, NULL);
    while (!fx->n_held)
        uv_run(&fx->loop, UV_RUN_ONCE);
    int closed = 0;
    ty_rpc_server_close(fx->srv, on_closed_flag, &closed);
    fx->srv = NULL;
    assert_int_equal(fx->held_cancel_reason, TY_ESHUTDOWN);
    ty_rpc_call_end(fx->held[0]);
    fx->held[0] = NULL;
    assert_true(run_until(&fx->loop, &o.finals, 1, 2000));
    assert_int_equal(o.status, TY_ECONNRESET);
    assert_true(run_until(&fx->loop, &closed, 1, 2000));
}

static void test_refused_then_backoff(void **state)
{
    struct fixture *fx = *state;
    /* a port with nothing listening: bind, read the port, close */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    bind(s, (struct sockaddr *)&a, sizeof(a));
    getsockname(s, (struct sockaddr *)&a, &al);
    close(s);
    ty_rpc_client_t *c;
    struct ty_rpc_client_opts co = {.loop = &fx->loop,
                                    .host = "127.0.0.1",
                                    .port = ntohs(a.sin_port),
                                    .backoff_initial_ms = 10,
                                    .backoff_max_ms = 40};
    assert_int_equal(ty_rpc_client_new(&c, &co), 0);
    struct outcome o = {0};
    struct ty_rpc_call_opts t = {.timeout_ms = 300};
    ty_rpc_client_call(c, M_ECHO, NULL, 0, &t, on_result, &o, NULL);
    assert_true(run_until(&fx->loop, &o.finals, 1, 2000));
    assert_int_equal(o.status, TY_ETIMEDOUT);
    struct ty_rpc_client_stats st;
    ty_rpc_client_stats(c, &st);
    /* delays 10, 20, 40, 40, ... within 300 ms: at least 5 attempts, and capped */
    assert_true(st.connect_attempts >= 5);
    assert_int_equal(st.last_backoff_ms, 40);
    assert_int_equal(st.connects, 0);
    int closed = 0;
    ty_rpc_client_close(c, on_closed_flag, &closed);
    assert_true(run_until(&fx->loop, &closed, 1, 2000));
}

/* ---- malformed input on a raw socket -------------------------------------------------- */

struct logcap {
    int warns;
    char last[256];
};

static void capture(enum ty_log_level lv, const char *subsys, const char *msg, uint64_t sup,
                    void *arg)
{
    struct logcap *lc = arg;
    if (lv != TY_LOG_LEVEL_WARN || strcmp(subsys, "rpc") != 0)
        return;
    lc->warns++;
    snprintf(lc->last, sizeof(lc->last), "%s", msg);
}

struct raw_job {
    uint16_t port;
    const void *bytes;
    size_t len;
    int result; /* 1 = the server closed the connection */
    int done;
};

static void *raw_sender(void *arg)
{
    struct raw_job *j = arg;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(j->port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 2};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(s, (struct sockaddr *)&a, sizeof(a)) == 0) {
        send(s, j->bytes, j->len, MSG_NOSIGNAL);
        char buf[256];
        ssize_t n;
        while ((n = recv(s, buf, sizeof(buf), 0)) > 0)
            ; /* the server's handshake challenge, then the close */
        j->result = n == 0 || (n < 0 && errno == ECONNRESET);
    }
    close(s);
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_garbage_closes_only_that_connection(void **state)
{
    struct fixture *fx = *state;
    struct logcap lc = {0};
    ty_log_set_sink(capture, &lc);
    struct outcome first = {0};
    ty_rpc_client_call(fx->cli, M_ECHO, (const uint8_t *)"1", 1, NULL, on_result, &first, NULL);
    assert_true(run_until(&fx->loop, &first.finals, 1, 2000));

    const char garbage[] = "\x16\x03\x01 this is a TLS hello, not a frame at all........";
    struct raw_job j = {
        .port = ty_rpc_server_port(fx->srv), .bytes = garbage, .len = sizeof(garbage)};
    pthread_t th;
    pthread_create(&th, NULL, raw_sender, &j);
    assert_true(run_until(&fx->loop, &j.done, 1, 4000));
    pthread_join(th, NULL);
    ty_log_set_sink(NULL, NULL);
    assert_int_equal(j.result, 1);
    assert_true(lc.warns >= 1);
    assert_non_null(strstr(lc.last, "not a tycho cluster handshake"));

    struct outcome after = {0};
    ty_rpc_client_call(fx->cli, M_ECHO, (const uint8_t *)"2", 1, NULL, on_result, &after, NULL);
    assert_true(run_until(&fx->loop, &after.finals, 1, 2000));
    assert_int_equal(after.event, TY_RPC_EVENT_REPLY);
    assert_string_equal(after.reply, "2");
}

/* ---- mailbox ----------------------------------------------------------------------------- */

enum { MB_THREADS = 4, MB_PER_THREAD = 5000 };

struct mb_state {
    ty_rpc_mailbox_t *mb;
    int count;
    uint32_t last[MB_THREADS];
    bool order_ok;
};

struct mb_msg {
    struct mb_state *st;
    uint32_t thread, seq;
};

static void mb_work(void *arg)
{
    struct mb_msg *m = arg;
    if (m->seq != m->st->last[m->thread] + 1)
        m->st->order_ok = false;
    m->st->last[m->thread] = m->seq;
    m->st->count++;
    free(m);
}

struct mb_thread_arg {
    struct mb_state *st;
    uint32_t id;
};

static void *mb_poster(void *arg)
{
    struct mb_thread_arg *ta = arg;
    for (uint32_t i = 1; i <= MB_PER_THREAD; i++) {
        struct mb_msg *m = malloc(sizeof(*m));
        *m = (struct mb_msg){ta->st, ta->id, i};
        if (ty_rpc_mailbox_post(ta->st->mb, mb_work, m) != 0)
            free(m);
    }
    return NULL;
}

static void test_mailbox_threads(void **state)
{
    struct fixture *fx = *state;
    struct mb_state st = {.order_ok = true};
    assert_int_equal(ty_rpc_mailbox_new(&st.mb, &fx->loop), 0);
    pthread_t th[MB_THREADS];
    struct mb_thread_arg ta[MB_THREADS];
    for (uint32_t i = 0; i < MB_THREADS; i++) {
        ta[i] = (struct mb_thread_arg){&st, i};
        pthread_create(&th[i], NULL, mb_poster, &ta[i]);
    }
    assert_true(run_until(&fx->loop, &st.count, MB_THREADS * MB_PER_THREAD, 10000));
    for (int i = 0; i < MB_THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(st.count, MB_THREADS * MB_PER_THREAD);
    assert_true(st.order_ok);
    int closed = 0;
    ty_rpc_mailbox_close(st.mb, on_closed_flag, &closed);
    assert_true(run_until(&fx->loop, &closed, 1, 2000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unary_and_queued_before_connect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remote_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_typed_handler, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout_exactly_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_close_cancels_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_close_fails_calls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_then_backoff, setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbage_closes_only_that_connection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailbox_threads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
