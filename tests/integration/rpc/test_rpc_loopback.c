/* Two processes on loopback: this test drives a client; rpc_test_server (argv[1]) is the server,
 * started with fork+exec on an ephemeral port.
 *   - 10,000 request/response pairs and 1,000 streamed messages: none lost, duplicated or
 *     reordered (ids and payload contents checked);
 *   - garbage, truncated, oversized and otherwise malformed frames on other connections while
 *     well-formed calls run: every well-formed call succeeds, the server stays up, each bad
 *     connection is closed with a logged reason;
 *   - per-call timeouts complete exactly once;
 *   - reconnect: kill -9 the server, restart it on the same port, calls succeed again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/auth.h"
#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/rpc.h"
#include "tycho.pb-c.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

enum { M_PING = TYCHO__V1__METHOD__METHOD_PING, M_STREAM_CHUNKS = 1001, M_SLOW = 1002 };
enum { SERVER_MAX_FRAME = 65536 };

static const char *g_server_exe;

struct server_proc {
    pid_t pid;
    uint16_t port;
    char log_path[64]; /* the server's stderr */
};

/* Start rpc_test_server on `port` (0 = ephemeral) and wait for its "PORT n" line. */
static void server_start(struct server_proc *sp, uint16_t port)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    if (!sp->log_path[0]) {
        snprintf(sp->log_path, sizeof(sp->log_path), "/tmp/ty-rpc-server-XXXXXX");
        int lf = mkstemp(sp->log_path);
        assert_true(lf >= 0);
        close(lf);
    }
    char port_s[16], max_s[16];
    snprintf(port_s, sizeof(port_s), "%u", port);
    snprintf(max_s, sizeof(max_s), "%u", SERVER_MAX_FRAME);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        FILE *lf = fopen(sp->log_path, "a");
        if (lf)
            dup2(fileno(lf), 2);
        close(fds[0]);
        execl(g_server_exe, g_server_exe, "--port", port_s, "--max-frame", max_s, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    char line[64] = {0};
    size_t have = 0;
    while (have < sizeof(line) - 1 && !strchr(line, '\n')) {
        assert_true(poll(&pfd, 1, 5000) == 1);
        ssize_t n = read(fds[0], line + have, sizeof(line) - 1 - have);
        assert_true(n > 0);
        have += (size_t)n;
    }
    close(fds[0]);
    unsigned p = 0;
    assert_int_equal(sscanf(line, "PORT %u", &p), 1);
    assert_true(p > 0 && p < 65536);
    sp->pid = pid;
    sp->port = (uint16_t)p;
}

static bool server_alive(const struct server_proc *sp)
{
    int st;
    return waitpid(sp->pid, &st, WNOHANG) == 0 && kill(sp->pid, 0) == 0;
}

/* SIGTERM and expect a clean exit 0. */
static void server_stop(struct server_proc *sp)
{
    int st = 0;
    kill(sp->pid, SIGTERM);
    assert_int_equal(waitpid(sp->pid, &st, 0), sp->pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void server_kill(struct server_proc *sp)
{
    int st;
    kill(sp->pid, SIGKILL);
    waitpid(sp->pid, &st, 0);
}

/* ---- client-side plumbing ------------------------------------------------------------------ */

static void tick(uv_timer_t *t)
{
}

static bool run_until(uv_loop_t *loop, const int *flag, int want, uint64_t ms)
{
    uv_timer_t t;
    uv_timer_init(loop, &t);
    uv_timer_start(&t, tick, 5, 5);
    uint64_t end = ty_clock_ms() + ms;
    while (__atomic_load_n(flag, __ATOMIC_SEQ_CST) < want && ty_clock_ms() < end)
        uv_run(loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return __atomic_load_n(flag, __ATOMIC_SEQ_CST) >= want;
}

static void run_for(uv_loop_t *loop, uint64_t ms)
{
    int never = 0;
    run_until(loop, &never, 1, ms);
}

static void on_closed_flag(void *arg)
{
    (*(int *)arg)++;
}

static ty_rpc_client_t *client_new(uv_loop_t *loop, uint16_t port, ty_rpc_state_cb cb, void *arg)
{
    ty_rpc_client_t *c;
    struct ty_rpc_client_opts co = {.loop = loop,
                                    .host = "127.0.0.1",
                                    .port = port,
                                    .call_timeout_ms = 10000,
                                    .backoff_initial_ms = 20,
                                    .backoff_max_ms = 200,
                                    .state_cb = cb,
                                    .state_arg = arg};
    assert_int_equal(ty_rpc_client_new(&c, &co), 0);
    return c;
}

static void client_close(uv_loop_t *loop, ty_rpc_client_t *c)
{
    int closed = 0;
    ty_rpc_client_close(c, on_closed_flag, &closed);
    assert_true(run_until(loop, &closed, 1, 2000));
}

/* Deterministic payload bytes of ping i. */
static size_t fill_pattern(uint8_t *buf, uint64_t i)
{
    size_t n = 16 + (size_t)(i % 48);
    for (size_t k = 0; k < n; k++)
        buf[k] = (uint8_t)(i * 131 + k * 7);
    return n;
}

/* ---- test 1: 10,000 request/response pairs + 1,000 streamed messages --------------------- */

enum { N_PAIRS = 10000, WINDOW = 256, N_STREAMS = 4, STREAM_LEN = 250 };

struct pairs {
    ty_rpc_client_t *cli;
    uv_loop_t *loop;
    uint32_t next_send, done, next_expected;
    uint8_t seen[N_PAIRS];
    int errors, bad_payload, reordered, duplicates;
    int done_flag;
    bool paced; /* no chaining: a timer issues the pings */
};

struct pair_slot {
    struct pairs *pr;
    uint32_t index;
};

static void send_ping(struct pairs *pr);

static void on_pong(const struct ty_rpc_result *r, void *arg)
{
    struct pair_slot *slot = arg;
    struct pairs *pr = slot->pr;
    uint32_t i = slot->index;
    free(slot);
    if (pr->seen[i]++)
        pr->duplicates++;
    if (i != pr->next_expected)
        pr->reordered++;
    pr->next_expected = i + 1;
    if (r->event != TY_RPC_EVENT_REPLY) {
        pr->errors++;
    } else {
        Tycho__V1__Ping *p = tycho__v1__ping__unpack(NULL, r->len, r->payload);
        uint8_t want[64];
        size_t n = fill_pattern(want, i);
        if (!p || p->nonce != i || p->data.len != n || memcmp(p->data.data, want, n) != 0)
            pr->bad_payload++;
        if (p)
            tycho__v1__ping__free_unpacked(p, NULL);
    }
    if (++pr->done == N_PAIRS)
        pr->done_flag = 1;
    if (!pr->paced)
        send_ping(pr);
}

static void send_ping(struct pairs *pr)
{
    if (pr->next_send >= N_PAIRS)
        return;
    uint8_t data[64];
    Tycho__V1__Ping p = TYCHO__V1__PING__INIT;
    p.nonce = pr->next_send;
    p.data.data = data;
    p.data.len = fill_pattern(data, pr->next_send);
    struct pair_slot *slot = malloc(sizeof(*slot));
    *slot = (struct pair_slot){pr, pr->next_send};
    assert_int_equal(ty_rpc_client_call_msg(pr->cli, M_PING, &p.base, NULL, on_pong, slot, NULL),
                     0);
    pr->next_send++;
}

struct stream_check {
    uint64_t stream_id;
    uint32_t items, next_seq;
    int bad, finals, end_ok;
};

static void on_chunk(const struct ty_rpc_result *r, void *arg)
{
    struct stream_check *sc = arg;
    if (r->event != TY_RPC_EVENT_ITEM) {
        sc->finals++;
        sc->end_ok = r->event == TY_RPC_EVENT_END;
        return;
    }
    Tycho__V1__TokenChunk *c = tycho__v1__token_chunk__unpack(NULL, r->len, r->payload);
    char want[64];
    snprintf(want, sizeof(want), "s%llu-%u", (unsigned long long)sc->stream_id, sc->next_seq);
    if (!c || c->seq != sc->next_seq || c->request_id != sc->stream_id || c->n_token_ids != 2 ||
        c->token_ids[0] != sc->next_seq || c->token_ids[1] != sc->next_seq * 7u ||
        strcmp(c->text, want) != 0)
        sc->bad++;
    if (c)
        tycho__v1__token_chunk__free_unpacked(c, NULL);
    sc->next_seq++;
    sc->items++;
}

static void start_streams(ty_rpc_client_t *cli, struct stream_check *sc, int n, uint32_t len)
{
    for (int s = 0; s < n; s++) {
        sc[s] = (struct stream_check){.stream_id = 100 + (uint64_t)s};
        Tycho__V1__Ping p = TYCHO__V1__PING__INIT;
        p.nonce = len;
        p.wall_ms = sc[s].stream_id;
        struct ty_rpc_call_opts o = {.stream = true};
        assert_int_equal(
            ty_rpc_client_call_msg(cli, M_STREAM_CHUNKS, &p.base, &o, on_chunk, &sc[s], NULL), 0);
    }
}

static void test_pairs_and_streams(void **state)
{
    struct server_proc sp = {0};
    server_start(&sp, 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct pairs *pr = calloc(1, sizeof(*pr));
    pr->loop = &loop;
    pr->cli = client_new(&loop, sp.port, NULL, NULL);

    uint64_t t0 = ty_clock_us();
    for (int i = 0; i < WINDOW; i++)
        send_ping(pr);
    struct stream_check sc[N_STREAMS];
    start_streams(pr->cli, sc, N_STREAMS, STREAM_LEN); /* interleaved with the pings */
    assert_true(run_until(&loop, &pr->done_flag, 1, 30000));
    for (int s = 0; s < N_STREAMS; s++)
        assert_true(run_until(&loop, &sc[s].finals, 1, 10000));
    uint64_t us = ty_clock_us() - t0;
    run_for(&loop, 100); /* anything late or duplicated would show up now */

    assert_int_equal(pr->done, N_PAIRS);
    assert_int_equal(pr->errors, 0);
    assert_int_equal(pr->duplicates, 0);
    assert_int_equal(pr->reordered, 0);
    assert_int_equal(pr->bad_payload, 0);
    for (int i = 0; i < N_PAIRS; i++)
        assert_int_equal(pr->seen[i], 1);
    uint32_t total_items = 0;
    for (int s = 0; s < N_STREAMS; s++) {
        assert_int_equal(sc[s].finals, 1);
        assert_true(sc[s].end_ok);
        assert_int_equal(sc[s].items, STREAM_LEN);
        assert_int_equal(sc[s].bad, 0);
        total_items += sc[s].items;
    }
    assert_int_equal(total_items, 1000);
    print_message("10000 pairs (window %d) + 1000 stream items: %.1f ms\n", WINDOW, us / 1000.0);
    assert_int_equal(ty_rpc_client_pending(pr->cli), 0);
    client_close(&loop, pr->cli);
    free(pr);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    server_stop(&sp);
    unlink(sp.log_path);
}

/* ---- test 3: timeouts ------------------------------------------------------------------------ */

struct timed {
    int finals, status, event;
    uint64_t t_done;
};

static void on_timed(const struct ty_rpc_result *r, void *arg)
{
    struct timed *t = arg;
    t->finals++;
    t->status = r->status;
    t->event = r->event;
    t->t_done = ty_clock_ms();
}

static void call_slow(ty_rpc_client_t *c, uint64_t delay_ms, uint32_t timeout_ms, struct timed *t)
{
    Tycho__V1__Ping p = TYCHO__V1__PING__INIT;
    p.nonce = delay_ms;
    struct ty_rpc_call_opts o = {.timeout_ms = timeout_ms};
    assert_int_equal(ty_rpc_client_call_msg(c, M_SLOW, &p.base, &o, on_timed, t, NULL), 0);
}

/* ---- test 2: malformed input on other connections ------------------------------------------- */

enum bad_kind {
    BAD_GARBAGE,
    BAD_TRUNCATED_HEADER,
    BAD_TRUNCATED_PAYLOAD,
    BAD_OVERSIZED,
    BAD_VERSION,
    BAD_KIND,
    BAD_WRONG_DIRECTION,
    BAD_VALID_THEN_GARBAGE,
    BAD_COUNT
};

struct attacker {
    uint16_t port;
    int rounds;
    int attempts, closed_by_server, got_valid_reply;
    int done;
};

static size_t header(uint8_t *h, uint8_t version, uint8_t kind, uint16_t method, uint64_t id,
                     uint32_t len)
{
    /* written out from the spec (docs/arch/rpc.md), independent of the encoder */
    const uint8_t magic[4] = {'T', 'Y', 'R', 'P'};
    memcpy(h, magic, 4);
    h[4] = version;
    h[5] = kind;
    h[6] = (uint8_t)method;
    h[7] = (uint8_t)(method >> 8);
    for (int i = 0; i < 8; i++)
        h[8 + i] = (uint8_t)(id >> (8 * i));
    for (int i = 0; i < 4; i++)
        h[16 + i] = (uint8_t)(len >> (8 * i));
    return 20;
}

static size_t build_attack(enum bad_kind k, uint8_t *buf, bool *half_close)
{
    size_t n = 0;
    *half_close = false;
    switch (k) {
    case BAD_GARBAGE:
        for (n = 0; n < 300; n++)
            buf[n] = (uint8_t)(n * 37 + 11);
        return n;
    case BAD_TRUNCATED_HEADER:
        *half_close = true;
        return header(buf, 1, 1, M_PING, 1, 10) - 9;
    case BAD_TRUNCATED_PAYLOAD:
        *half_close = true;
        n = header(buf, 1, 1, M_PING, 1, 100);
        memset(buf + n, 0x08, 10);
        return n + 10;
    case BAD_OVERSIZED:
        n = header(buf, 1, 1, M_PING, 1, 1u << 20); /* server max is 64 KiB */
        memset(buf + n, 0, 1000);
        return n + 1000;
    case BAD_VERSION:
        return header(buf, 9, 1, M_PING, 1, 0);
    case BAD_KIND:
        return header(buf, 1, 42, M_PING, 1, 0);
    case BAD_WRONG_DIRECTION:
        return header(buf, 1, 2 /* response */, M_PING, 1, 0);
    case BAD_VALID_THEN_GARBAGE: {
        /* Ping{nonce=150}: 08 96 01, then garbage: the valid call is answered first */
        n = header(buf, 1, 1, M_PING, 77, 3);
        buf[n++] = 0x08;
        buf[n++] = 0x96;
        buf[n++] = 0x01;
        memcpy(buf + n, "GARBAGE GARBAGE GARBAGE!", 24);
        return n + 24;
    }
    default:
        return 0;
    }
}

/* Send one attack; true when the server closed the connection within 3 s. */
static bool attack_once(struct attacker *a, enum bad_kind k)
{
    uint8_t buf[2048];
    bool half_close;
    size_t n = build_attack(k, buf, &half_close);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons(a->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 3};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    bool closed = false;
    /* a peer past the handshake (the server here is insecure): the frame decoder is the target */
    if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        ty_auth_handshake_fd(s, NULL, false, 3000, NULL, 0) == 0) {
        send(s, buf, n, MSG_NOSIGNAL);
        if (half_close)
            shutdown(s, SHUT_WR);
        uint8_t rb[512];
        size_t got = 0;
        for (;;) {
            ssize_t r = recv(s, rb + got, sizeof(rb) - got, 0);
            if (r == 0 || (r < 0 && errno == ECONNRESET)) {
                closed = true;
                break;
            }
            if (r < 0)
                break; /* timeout: the server kept it open */
            got += (size_t)r;
            if (got == sizeof(rb))
                got = 0;
        }
        /* the valid request before the garbage got its response (kind 2, id 77) */
        if (k == BAD_VALID_THEN_GARBAGE && got >= 20 && rb[5] == 2 && rb[8] == 77)
            a->got_valid_reply++;
    }
    close(s);
    return closed;
}

static void pace_pings(uv_timer_t *t)
{
    for (int i = 0; i < 4; i++)
        send_ping(t->data);
}

static void *attacker_main(void *arg)
{
    struct attacker *a = arg;
    for (int r = 0; r < a->rounds; r++) {
        for (int k = 0; k < BAD_COUNT; k++) {
            a->attempts++;
            if (attack_once(a, (enum bad_kind)k))
                a->closed_by_server++;
        }
        usleep(20000);
    }
    __atomic_store_n(&a->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static bool file_contains(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static void test_malformed_frames_on_other_connections(void **state)
{
    struct server_proc sp = {0};
    server_start(&sp, 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct pairs *pr = calloc(1, sizeof(*pr));
    pr->loop = &loop;
    pr->cli = client_new(&loop, sp.port, NULL, NULL);

    struct attacker a = {.port = sp.port, .rounds = 6};
    pthread_t th;
    pthread_create(&th, NULL, attacker_main, &a);
    /* well-formed traffic exactly while the attacker runs: 4 pings every 2 ms */
    pr->paced = true;
    uv_timer_t pacer;
    uv_timer_init(&loop, &pacer);
    pacer.data = pr;
    uv_timer_start(&pacer, pace_pings, 0, 2);
    assert_true(run_until(&loop, &a.done, 1, 40000));
    uv_close((uv_handle_t *)&pacer, NULL);
    pthread_join(th, NULL);
    uint32_t issued = pr->next_send;
    pr->next_send = N_PAIRS; /* stop issuing; let the in-flight ones finish */
    assert_true(run_until(&loop, (const int *)&pr->done, (int)issued, 10000));

    print_message("%u well-formed calls during %d malformed connections\n", pr->done, a.attempts);
    assert_true(pr->done > 100); /* calls really ran during the attacks */
    assert_int_equal(pr->errors, 0);
    assert_int_equal(pr->duplicates, 0);
    assert_int_equal(pr->reordered, 0);
    assert_int_equal(pr->bad_payload, 0);
    assert_int_equal(a.closed_by_server, a.attempts);
    assert_int_equal(a.got_valid_reply, a.rounds);
    assert_true(server_alive(&sp));

    /* a fresh client still works after all that */
    client_close(&loop, pr->cli);
    free(pr);
    ty_rpc_client_t *c2 = client_new(&loop, sp.port, NULL, NULL);
    struct timed last = {0};
    call_slow(c2, 0, 3000, &last);
    assert_true(run_until(&loop, &last.finals, 1, 5000));
    assert_int_equal(last.event, TY_RPC_EVENT_REPLY);
    client_close(&loop, c2);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    server_stop(&sp);

    /* each kind of bad input was logged with its reason */
    assert_true(file_contains(sp.log_path, "bad magic"));
    assert_true(file_contains(sp.log_path, "truncated frame at EOF"));
    assert_true(file_contains(sp.log_path, "exceeds the maximum"));
    assert_true(file_contains(sp.log_path, "unsupported frame version"));
    assert_true(file_contains(sp.log_path, "unknown frame kind"));
    assert_true(file_contains(sp.log_path, "unexpected response frame"));
    unlink(sp.log_path);
}

static void test_timeouts(void **state)
{
    struct server_proc sp = {0};
    server_start(&sp, 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    ty_rpc_client_t *c = client_new(&loop, sp.port, NULL, NULL);
    enum { N = 40 };
    struct timed t[N] = {{0}};
    uint64_t t0 = ty_clock_ms();
    /* even: fast reply, long timeout -> ok; odd: slow reply, short timeout -> ETIMEDOUT */
    for (int i = 0; i < N; i++)
        call_slow(c, i % 2 ? 600 : 10, i % 2 ? 150 : 3000, &t[i]);
    int all = 0;
    for (int i = 0; i < N; i++)
        all += run_until(&loop, &t[i].finals, 1, 5000);
    assert_int_equal(all, N);
    run_for(&loop, 800); /* the slow replies would have arrived by now */
    for (int i = 0; i < N; i++) {
        assert_int_equal(t[i].finals, 1);
        if (i % 2) {
            assert_int_equal(t[i].status, TY_ETIMEDOUT);
            assert_true(t[i].t_done - t0 >= 145 && t[i].t_done - t0 < 600);
        } else {
            assert_int_equal(t[i].event, TY_RPC_EVENT_REPLY);
        }
    }
    struct ty_rpc_client_stats st;
    ty_rpc_client_stats(c, &st);
    assert_int_equal(st.calls_timed_out, N / 2);
    client_close(&loop, c);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    server_stop(&sp);
    unlink(sp.log_path);
}

/* ---- test 4: reconnect ----------------------------------------------------------------------- */

struct conn_watch {
    int ups, downs;
};

static void on_state(ty_rpc_client_t *c, bool connected, int reason, void *arg)
{
    struct conn_watch *w = arg;
    if (connected)
        w->ups++;
    else
        w->downs++;
}

static void test_reconnect(void **state)
{
    struct server_proc sp = {0};
    server_start(&sp, 0);
    uint16_t port = sp.port;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct conn_watch w = {0};
    ty_rpc_client_t *c = client_new(&loop, port, on_state, &w);

    struct timed first = {0}, pending = {0}, queued = {0}, after = {0};
    call_slow(c, 0, 2000, &first);
    assert_true(run_until(&loop, &first.finals, 1, 3000));
    assert_int_equal(first.event, TY_RPC_EVENT_REPLY);
    assert_int_equal(w.ups, 1);

    call_slow(c, 5000, 10000, &pending); /* in flight when the server dies */
    run_for(&loop, 50);
    uint64_t t_kill = ty_clock_ms();
    server_kill(&sp);
    assert_true(run_until(&loop, &pending.finals, 1, 3000));
    assert_int_equal(pending.status, TY_ECONNRESET);
    assert_true(pending.t_done - t_kill < 1000);
    assert_int_equal(w.downs, 1);

    call_slow(c, 0, 8000, &queued); /* issued while the server is down: waits, then goes */
    run_for(&loop, 800);            /* several refused attempts, backoff reaches the cap */
    struct ty_rpc_client_stats st;
    ty_rpc_client_stats(c, &st);
    assert_true(st.connect_attempts >= 5);
    assert_int_equal(st.last_backoff_ms, 200);
    assert_int_equal(queued.finals, 0);

    server_start(&sp, port);
    assert_int_equal(sp.port, port);
    assert_true(run_until(&loop, &queued.finals, 1, 5000));
    assert_int_equal(queued.event, TY_RPC_EVENT_REPLY);
    call_slow(c, 0, 2000, &after);
    assert_true(run_until(&loop, &after.finals, 1, 3000));
    assert_int_equal(after.event, TY_RPC_EVENT_REPLY);
    run_for(&loop, 50);
    assert_int_equal(pending.finals, 1);
    assert_int_equal(w.ups, 2);
    ty_rpc_client_stats(c, &st);
    assert_int_equal(st.connects, 2);
    assert_int_equal(st.disconnects, 1);
    client_close(&loop, c);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    server_stop(&sp);
    unlink(sp.log_path);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/TO/rpc_test_server\n", argv[0]);
        return 2;
    }
    g_server_exe = argv[1];
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pairs_and_streams),
        cmocka_unit_test(test_malformed_frames_on_other_connections),
        cmocka_unit_test(test_timeouts),
        cmocka_unit_test(test_reconnect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
