/* End-to-end transfer tests between this process and a peer process (see harness.h).
 *
 * Usage: test_xfer_e2e tcp|local|netns|oob|kill|notify|etcd|rdma|rdma_kill (the rdma modes
 * skip with 77 without an RDMA device). Every mode moves real bytes over
 * real sockets and checks them against the independent pattern or the peer's own hash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "harness.h"
#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/transfer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>
#include <xxhash.h>

#define MiB (1ull << 20)

static char g_exe[4096];
static const char *g_mode;

static void *map_buf(uint64_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    return p;
}

/* ---- the random round: non-overlapping reads of A and writes of B ------------------------- */

struct round_ctx {
    ty_xfer_engine_t *e;
    ty_xfer_segment_t *seg;
    struct peer_proc *peer;
    uint8_t *local;  /* registered, peer->size bytes */
    uint8_t *shadow; /* what B must hold */
    uint64_t rng;
};

static uint64_t rand_len(uint64_t *rng, uint64_t max)
{
    double u = (double)(rng_next(rng) >> 11) / (double)(1ull << 53);
    uint64_t len = (uint64_t)exp(u * log((double)(64 * MiB)));
    len = len < 1 ? 1 : len > 64 * MiB ? 64 * MiB : len;
    return len > max ? max : len;
}

/* One round over [0, size): tasks spread over n_batches batches submitted before any wait. */
static void run_round(struct round_ctx *c, int round, size_t n_batches)
{
    struct ty_xfer_request reqs[256];
    size_t n = 0;
    uint64_t size = c->peer->size, cur = rng_next(&c->rng) % 4096;
    while (cur < size && n < 256) {
        uint64_t len = rand_len(&c->rng, size - cur);
        if (round == 0 && n == 0)
            len = 1;
        if (round == 0 && n == 1 && size - cur >= 64 * MiB)
            len = 64 * MiB;
        bool write = rng_next(&c->rng) & 1;
        struct ty_xfer_request *r = &reqs[n++];
        r->op = write ? TY_XFER_OP_WRITE : TY_XFER_OP_READ;
        r->local = c->local + cur;
        r->segment = c->seg;
        r->remote = (write ? c->peer->addr_b : c->peer->addr_a) + cur;
        r->len = len;
        if (write) {
            for (uint64_t i = 0; i < len; i++)
                c->local[cur + i] = (uint8_t)rng_next(&c->rng);
            memcpy(c->shadow + cur, c->local + cur, len);
        } else {
            memset(c->local + cur, 0xEE, len);
        }
        cur += len + rng_next(&c->rng) % 8192;
    }
    ty_xfer_batch_t *b[8];
    size_t per = (n + n_batches - 1) / n_batches;
    for (size_t k = 0; k < n_batches; k++) {
        assert_int_equal(ty_xfer_batch_new(c->e, per, &b[k]), 0);
        size_t lo = k * per, hi = lo + per > n ? n : lo + per;
        if (lo < hi)
            assert_int_equal(ty_xfer_batch_submit(b[k], &reqs[lo], hi - lo), 0);
    }
    for (size_t k = 0; k < n_batches; k++) {
        assert_int_equal(ty_xfer_batch_wait(b[k], 30000), 0);
        assert_int_equal(ty_xfer_batch_free(b[k]), 0);
    }
    uint8_t *expect = malloc(64 * MiB);
    for (size_t i = 0; i < n; i++) {
        if (reqs[i].op != TY_XFER_OP_READ)
            continue;
        uint64_t off = reqs[i].remote - c->peer->addr_a;
        pattern_fill(expect, PATTERN_SEED, off, reqs[i].len);
        assert_memory_equal(reqs[i].local, expect, reqs[i].len);
    }
    free(expect);
}

static void round_setup(struct round_ctx *c, const char *transport, struct peer_proc *peer,
                        const char *host, const char *peer_host)
{
    struct ty_xfer_engine_opts o = {
        .transport = transport, .listen_host = host, .timeout_ms = 3000, .checksum = true};
    memset(c, 0, sizeof(*c));
    c->peer = peer;
    c->rng = 0x1234567 + (uint64_t)getpid();
    assert_int_equal(ty_xfer_engine_new(&c->e, &o), 0);
    c->local = map_buf(peer->size);
    c->shadow = calloc(1, peer->size);
    assert_int_equal(ty_xfer_mem_register(c->e, c->local, peer->size, "cpu:0"), 0);
    char name[128];
    snprintf(name, sizeof(name), "%s:%u", peer_host, peer->port);
    assert_int_equal(ty_xfer_segment_open(c->e, name, &c->seg), 0);
}

static void round_check_b(struct round_ctx *c)
{
    /* the peer's own view of B, and B read back through the engine */
    uint64_t size = c->peer->size;
    assert_true(peer_hash(c->peer, c->peer->addr_b, size) == XXH3_64bits(c->shadow, size));
    ty_xfer_batch_t *b;
    assert_int_equal(ty_xfer_batch_new(c->e, 1, &b), 0);
    struct ty_xfer_request r = {TY_XFER_OP_READ, c->local, c->seg, c->peer->addr_b, size};
    assert_int_equal(ty_xfer_batch_submit(b, &r, 1), 0);
    assert_int_equal(ty_xfer_batch_wait(b, 30000), 0);
    assert_int_equal(ty_xfer_batch_free(b), 0);
    assert_memory_equal(c->local, c->shadow, size);
}

static void round_teardown(struct round_ctx *c)
{
    ty_xfer_segment_close(c->e, c->seg);
    ty_xfer_engine_free(c->e);
    munmap(c->local, c->peer->size);
    free(c->shadow);
}

static void random_rounds(const char *transport, const char *host, const char *peer_host,
                          const char *netns, bool shared)
{
    struct peer_proc peer;
    assert_int_equal(peer_start(&peer, g_exe, peer_host, 128, netns, NULL, NULL, shared), 0);
    struct round_ctx c;
    round_setup(&c, transport, &peer, host, peer_host);
    assert_string_equal(ty_xfer_segment_transport(c.seg), transport);
    for (int r = 0; r < 4; r++)
        run_round(&c, r, 4);
    round_check_b(&c);
    struct ty_xfer_stats st;
    ty_xfer_engine_stats(c.e, &st);
    assert_int_equal(st.tasks_failed, 0);
    assert_true(st.tasks_done > 8);
    assert_int_equal(strcmp(transport, "tcp") == 0    ? st.segments_tcp
                     : strcmp(transport, "rdma") == 0 ? st.segments_rdma
                                                      : st.segments_local,
                     1);
    round_teardown(&c);
    peer_stop(&peer);
}

/* A region the peer registers after we opened it is reachable (the segment refreshes its view
 * on a miss); bytes are checked against the pattern the peer filled it with. */
static void late_region_check(const char *transport, bool shared)
{
    struct peer_proc peer;
    assert_int_equal(peer_start(&peer, g_exe, "127.0.0.1", 4, NULL, NULL, NULL, shared), 0);
    struct round_ctx c;
    round_setup(&c, transport, &peer, "127.0.0.1", "127.0.0.1");
    assert_string_equal(ty_xfer_segment_transport(c.seg), transport);
    uint64_t late = peer_late_region(&peer, 2 * MiB);
    assert_true(late != 0);
    struct ty_xfer_request r = {TY_XFER_OP_READ, c.local, c.seg, late + 4096, MiB};
    ty_xfer_batch_t *b;
    assert_int_equal(ty_xfer_batch_new(c.e, 1, &b), 0);
    assert_int_equal(ty_xfer_batch_submit(b, &r, 1), 0);
    assert_int_equal(ty_xfer_batch_wait(b, 10000), 0);
    assert_int_equal(ty_xfer_batch_free(b), 0);
    uint8_t *expect = malloc(MiB);
    pattern_fill(expect, PATTERN_SEED + 2, 4096, MiB);
    assert_memory_equal(c.local, expect, MiB);
    free(expect);
    round_teardown(&c);
    peer_stop(&peer);
}

/* Unregistering local memory while a TCP write from it is queued: unregister waits for the
 * slices being sent, and no byte written into that memory afterwards reaches the peer. */
static void unregister_during_write(void)
{
    struct peer_proc peer;
    assert_int_equal(peer_start(&peer, g_exe, "127.0.0.1", 64, NULL, NULL, NULL, false), 0);
    struct round_ctx c;
    round_setup(&c, "tcp", &peer, "127.0.0.1", "127.0.0.1");
    memset(c.local, 0x11, peer.size);
    ty_xfer_batch_t *b;
    assert_int_equal(ty_xfer_batch_new(c.e, 1, &b), 0);
    struct ty_xfer_request r = {TY_XFER_OP_WRITE, c.local, c.seg, peer.addr_b, peer.size};
    assert_int_equal(ty_xfer_batch_submit(b, &r, 1), 0);
    assert_int_equal(ty_xfer_mem_unregister(c.e, c.local), 0);
    memset(c.local, 0x22, peer.size); /* no longer ours to send */
    int rc = ty_xfer_batch_wait(b, 10000);
    assert_true(rc == 0 || rc == TY_EOUTOFRANGE);
    assert_int_equal(ty_xfer_batch_free(b), 0);
    /* B holds only 0x11 (sent before the unregister) and 0 (never sent): hash each 1 MiB */
    uint8_t *ones = malloc(MiB), *zeros = calloc(1, MiB);
    memset(ones, 0x11, MiB);
    uint64_t h1 = XXH3_64bits(ones, MiB), h0 = XXH3_64bits(zeros, MiB);
    int sent = 0;
    for (uint64_t off = 0; off < peer.size; off += MiB) {
        uint64_t h = peer_hash(&peer, peer.addr_b + off, MiB);
        assert_true(h == h1 || h == h0);
        sent += h == h1;
    }
    fprintf(stderr, "unregister during write: %d of 64 slices sent, wait rc %d\n", sent, rc);
    free(ones);
    free(zeros);
    ty_xfer_segment_close(c.e, c.seg);
    ty_xfer_engine_free(c.e);
    munmap(c.local, peer.size);
    free(c.shadow);
    peer_stop(&peer);
}

static void test_tcp(void **state)
{
    random_rounds("tcp", "127.0.0.1", "127.0.0.1", NULL, false);
    late_region_check("tcp", false);
    unregister_during_write();
}

static void test_local(void **state)
{
    random_rounds("local", "127.0.0.1", "127.0.0.1", NULL, true);
    late_region_check("local", true);
}

/* ---- network namespaces ------------------------------------------------------------------------
 */

static char ns_a[32], ns_b[32];

static void netns_cleanup(void)
{
    char cmd[160];
    if (ns_a[0]) {
        snprintf(cmd, sizeof(cmd), "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", ns_a,
                 ns_b);
        if (system(cmd) != 0)
            fprintf(stderr, "netns cleanup failed\n");
    }
}

static int enter_ns(const char *ns);

static void test_netns(void **state)
{
    int x = 1 + getpid() % 250;
    char ip_a[32], ip_b[32], cmd[1024];
    snprintf(ns_a, sizeof(ns_a), "tyxf%da", (int)getpid());
    snprintf(ns_b, sizeof(ns_b), "tyxf%db", (int)getpid());
    snprintf(ip_a, sizeof(ip_a), "10.200.%d.1", x);
    snprintf(ip_b, sizeof(ip_b), "10.200.%d.2", x);
    atexit(netns_cleanup);
    snprintf(cmd, sizeof(cmd),
             "set -e; ip netns add %1$s; ip netns add %2$s;"
             "ip link add %1$s0 type veth peer name %2$s0;"
             "ip link set %1$s0 netns %1$s; ip link set %2$s0 netns %2$s;"
             "ip -n %1$s addr add %3$s/24 dev %1$s0; ip -n %2$s addr add %4$s/24 dev %2$s0;"
             "ip -n %1$s link set %1$s0 up; ip -n %2$s link set %2$s0 up;"
             "ip -n %1$s link set lo up; ip -n %2$s link set lo up",
             ns_a, ns_b, ip_a, ip_b);
    if (system(cmd) != 0) {
        netns_cleanup();
        ns_a[0] = '\0';
        fprintf(stderr, "network namespaces unavailable: skipping\n");
        exit(77);
    }
    assert_int_equal(enter_ns(ns_a), 0);
    random_rounds("tcp", ip_a, ip_b, ns_b, false);
}

#include <fcntl.h>
#include <sched.h>

static int enter_ns(const char *ns)
{
    char path[256];
    snprintf(path, sizeof(path), "/var/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    return rc;
}

/* ---- out-of-range accesses ----------------------------------------------------------------------
 */

static void one(ty_xfer_engine_t *e, struct ty_xfer_request *r, int want)
{
    ty_xfer_batch_t *b;
    assert_int_equal(ty_xfer_batch_new(e, 1, &b), 0);
    assert_int_equal(ty_xfer_batch_submit(b, r, 1), 0);
    assert_int_equal(ty_xfer_batch_wait(b, 10000), want);
    struct ty_xfer_task_status st;
    assert_int_equal(ty_xfer_batch_status(b, 0, &st), 0);
    assert_int_equal(st.state, want ? TY_XFER_TASK_FAILED : TY_XFER_TASK_DONE);
    assert_int_equal(st.err, want);
    assert_int_equal(ty_xfer_batch_free(b), 0);
}

static void test_oob(void **state)
{
    struct peer_proc peer;
    assert_int_equal(peer_start(&peer, g_exe, "127.0.0.1", 16, NULL, NULL, NULL, false), 0);
    struct round_ctx bad, good;
    round_setup(&bad, "tcp", &peer, "127.0.0.1", "127.0.0.1");
    round_setup(&good, "tcp", &peer, "127.0.0.1", "127.0.0.1");
    uint64_t B = peer.addr_b, S = peer.size;
    memset(bad.local, 0x5A, S);
    memset(good.local, 0xC3, S);
    /* straddling the end of B, far outside, and a read past A: all refused by the receiver */
    struct ty_xfer_request r1 = {TY_XFER_OP_WRITE, bad.local, bad.seg, B + S - 100, 4 * MiB};
    struct ty_xfer_request r2 = {TY_XFER_OP_WRITE, bad.local, bad.seg, 0x1000, 4096};
    struct ty_xfer_request r3 = {TY_XFER_OP_READ, bad.local, bad.seg, peer.addr_a + S - 1, 2};
    one(bad.e, &r1, TY_EOUTOFRANGE);
    one(bad.e, &r2, TY_EOUTOFRANGE);
    one(bad.e, &r3, TY_EOUTOFRANGE);
    /* the other initiator is served, and so is the offender's next valid write */
    struct ty_xfer_request g1 = {TY_XFER_OP_WRITE, good.local, good.seg, B, S / 2};
    struct ty_xfer_request g2 = {TY_XFER_OP_WRITE, bad.local, bad.seg, B + S / 2, S / 2};
    one(good.e, &g1, 0);
    one(bad.e, &g2, 0);
    one(bad.e, &r1, TY_EOUTOFRANGE);
    memset(bad.shadow, 0xC3, S / 2);
    memset(bad.shadow + S / 2, 0x5A, S / 2);
    assert_true(peer_hash(&peer, B, S) == XXH3_64bits(bad.shadow, S));
    /* the straddling write touched neither the end of B nor whatever lies after it (A) */
    uint8_t *pat = malloc(S);
    pattern_fill(pat, PATTERN_SEED, 0, S);
    assert_true(peer_hash(&peer, peer.addr_a, S) == XXH3_64bits(pat, S));
    free(pat);
    struct ty_xfer_stats st;
    ty_xfer_engine_stats(bad.e, &st);
    assert_int_equal(st.peer_failures, 0);
    assert_int_equal(st.reconnects, 0);
    assert_int_equal(st.tasks_failed, 4);
    /* a local range that was never registered is refused at submit */
    struct ty_xfer_request r4 = {TY_XFER_OP_WRITE, (uint8_t *)&st, bad.seg, B, 8};
    ty_xfer_batch_t *b;
    assert_int_equal(ty_xfer_batch_new(bad.e, 1, &b), 0);
    assert_int_equal(ty_xfer_batch_submit(b, &r4, 1), TY_EOUTOFRANGE);
    assert_int_equal(ty_xfer_batch_free(b), 0);
    round_teardown(&bad);
    round_teardown(&good);
    peer_stop(&peer);
}

/* ---- peer death and stall -----------------------------------------------------------------------
 */

#define KILL_TIMEOUT_MS 1000

struct big {
    ty_xfer_engine_t *e;
    uint8_t *local;
    uint64_t size;
};

/* Submit size bytes of writes as 16 tasks; wait until some bytes landed; signal the peer; return
 * ms until every task ended. Checks that every task unfinished at the signal FAILED. */
static uint64_t big_transfer_then(struct big *g, ty_xfer_segment_t *seg, struct peer_proc *peer,
                                  int sig, int want_err)
{
    ty_xfer_batch_t *b;
    struct ty_xfer_request reqs[16];
    uint64_t part = g->size / 16;
    for (int i = 0; i < 16; i++)
        reqs[i] = (struct ty_xfer_request){TY_XFER_OP_WRITE, g->local + i * part, seg,
                                           peer->addr_b + i * part, part};
    assert_int_equal(ty_xfer_batch_new(g->e, 16, &b), 0);
    assert_int_equal(ty_xfer_batch_submit(b, reqs, 16), 0);
    uint64_t done = 0, t_end = ty_clock_ms() + 20000;
    while (done < 32 * MiB && ty_clock_ms() < t_end) {
        done = 0;
        for (int i = 0; i < 16; i++) {
            struct ty_xfer_task_status st;
            ty_xfer_batch_status(b, (size_t)i, &st);
            done += st.bytes_done;
        }
    }
    assert_true(done >= 32 * MiB && done < g->size);
    bool was_done[16];
    for (int i = 0; i < 16; i++) {
        struct ty_xfer_task_status st;
        ty_xfer_batch_status(b, (size_t)i, &st);
        was_done[i] = st.state == TY_XFER_TASK_DONE;
    }
    uint64_t t0 = ty_clock_ms();
    peer_kill(peer, sig);
    int rc = ty_xfer_batch_wait(b, 4 * KILL_TIMEOUT_MS);
    uint64_t elapsed = ty_clock_ms() - t0;
    assert_int_not_equal(rc, TY_EBUSY);
    int failed = 0;
    for (int i = 0; i < 16; i++) {
        struct ty_xfer_task_status st;
        ty_xfer_batch_status(b, (size_t)i, &st);
        if (was_done[i])
            continue;
        /* A task whose last acknowledgement was already on its way when the signal landed may
         * still end DONE, complete; anything else must have FAILED, none may hang. */
        if (st.state == TY_XFER_TASK_DONE) {
            assert_int_equal(st.bytes_done, part);
            continue;
        }
        assert_int_equal(st.state, TY_XFER_TASK_FAILED);
        if (want_err)
            assert_int_equal(st.err, want_err);
        failed++;
    }
    assert_true(failed > 0);
    assert_int_equal(ty_xfer_batch_free(b), 0);
    fprintf(stderr, "signal %d: %d tasks failed within %" PRIu64 " ms\n", sig, failed, elapsed);
    return elapsed;
}

/* MiB of the big write: 1 GiB, or 256 MiB under a sanitizer (CMake sets TYCHO_SANITIZER_SLOW=1
 * there), where filling and copying 1 GiB in both processes alone outlasts the test's timeout.
 * Either is far more than the 32 MiB that must land before the signal. */
static uint64_t big_mib(void)
{
    const char *slow = getenv("TYCHO_SANITIZER_SLOW");
    return slow && strcmp(slow, "1") == 0 ? 256 : 1024;
}

/* SIGKILL during a 1 GiB write: every unfinished task fails within 2x the timeout, the next
 * submit to the dead peer fails at once, and a new peer is then served. */
static void kill_scenario(const char *transport, bool with_stall)
{
    struct big g = {.size = big_mib() * MiB};
    struct ty_xfer_engine_opts o = {.transport = transport, .timeout_ms = KILL_TIMEOUT_MS};
    assert_int_equal(ty_xfer_engine_new(&g.e, &o), 0);
    g.local = map_buf(g.size);
    memset(g.local, 0x42, g.size);
    assert_int_equal(ty_xfer_mem_register(g.e, g.local, g.size, "cpu:0"), 0);
    char name[64];
    struct peer_proc p1, p2, p3;
    ty_xfer_segment_t *s1, *s2, *s3;

    /* 1. SIGKILL during a 1 GiB write */
    assert_int_equal(peer_start(&p1, g_exe, "127.0.0.1", big_mib(), NULL, NULL, NULL, false), 0);
    snprintf(name, sizeof(name), "127.0.0.1:%u", p1.port);
    assert_int_equal(ty_xfer_segment_open(g.e, name, &s1), 0);
    assert_string_equal(ty_xfer_segment_transport(s1), transport);
    assert_true(big_transfer_then(&g, s1, &p1, SIGKILL, 0) <= 2 * KILL_TIMEOUT_MS);
    /* the dead peer's next submit tries to reconnect and fails at once, not hangs */
    struct ty_xfer_request r = {TY_XFER_OP_WRITE, g.local, s1, p1.addr_b, 4096};
    uint64_t t0 = ty_clock_ms();
    one(g.e, &r, TY_ECONNREFUSED);
    assert_true(ty_clock_ms() - t0 <= 2 * KILL_TIMEOUT_MS);
    ty_xfer_segment_close(g.e, s1);

    if (with_stall) {
        /* 2. SIGSTOP (a stalled peer): tasks fail with ETIMEDOUT; after SIGCONT the next submit
         *    reconnects to the same segment and succeeds. (tcp only: a stopped process's NIC
         *    still answers RDMA.) */
        assert_int_equal(peer_start(&p2, g_exe, "127.0.0.1", big_mib(), NULL, NULL, NULL, false),
                         0);
        snprintf(name, sizeof(name), "127.0.0.1:%u", p2.port);
        assert_int_equal(ty_xfer_segment_open(g.e, name, &s2), 0);
        uint64_t ms = big_transfer_then(&g, s2, &p2, SIGSTOP, TY_ETIMEDOUT);
        assert_true(ms >= KILL_TIMEOUT_MS / 2 && ms <= 2 * KILL_TIMEOUT_MS);
        kill(p2.pid, SIGCONT);
        struct ty_xfer_request r2 = {TY_XFER_OP_WRITE, g.local, s2, p2.addr_b, 8 * MiB};
        one(g.e, &r2, 0);
        assert_true(peer_hash(&p2, p2.addr_b, 8 * MiB) == XXH3_64bits(g.local, 8 * MiB));
        struct ty_xfer_stats st;
        ty_xfer_engine_stats(g.e, &st);
        assert_true(st.reconnects >= 1);
        assert_true(st.peer_failures >= 2);
        ty_xfer_segment_close(g.e, s2);
        peer_stop(&p2);
    }

    /* 3. a new peer is served normally */
    assert_int_equal(peer_start(&p3, g_exe, "127.0.0.1", 64, NULL, NULL, NULL, false), 0);
    snprintf(name, sizeof(name), "127.0.0.1:%u", p3.port);
    assert_int_equal(ty_xfer_segment_open(g.e, name, &s3), 0);
    for (uint64_t i = 0; i < 64 * MiB; i++)
        g.local[i] = (uint8_t)(i * 7 + (i >> 13));
    struct ty_xfer_request r3 = {TY_XFER_OP_WRITE, g.local, s3, p3.addr_b, 64 * MiB};
    one(g.e, &r3, 0);
    assert_true(peer_hash(&p3, p3.addr_b, 64 * MiB) == XXH3_64bits(g.local, 64 * MiB));
    ty_xfer_segment_close(g.e, s3);
    peer_stop(&p3);
    ty_xfer_engine_free(g.e);
    munmap(g.local, g.size);
}

static void test_kill(void **state)
{
    kill_scenario("tcp", true);
}

/* ---- notifications ------------------------------------------------------------------------------
 */

static void notify_after_write(const char *transport, bool shared)
{
    struct peer_proc peer;
    assert_int_equal(peer_start(&peer, g_exe, "127.0.0.1", 64, NULL, NULL, NULL, shared), 0);
    struct round_ctx c;
    round_setup(&c, transport, &peer, "127.0.0.1", "127.0.0.1");
    uint64_t rng = 99;
    for (uint64_t i = 0; i < peer.size; i++)
        c.local[i] = (uint8_t)rng_next(&rng);
    ty_xfer_batch_t *b;
    assert_int_equal(ty_xfer_batch_new(c.e, 1, &b), 0);
    struct ty_xfer_request r = {TY_XFER_OP_WRITE, c.local, c.seg, peer.addr_b, peer.size};
    assert_int_equal(ty_xfer_batch_submit(b, &r, 1), 0);
    /* sent without waiting for the batch: must still arrive after all 64 slices landed */
    char msg[128];
    int len = snprintf(msg, sizeof(msg), "%" PRIx64 " %" PRIu64 " %" PRIx64, peer.addr_b, peer.size,
                       XXH3_64bits(c.local, peer.size));
    assert_int_equal(ty_xfer_notify_send(c.e, c.seg, msg, (size_t)len), 0);
    char from[300];
    assert_int_equal(peer_check_notify(&peer, from, sizeof(from)), 1);
    assert_string_equal(from, ty_xfer_engine_name(c.e));
    assert_int_equal(ty_xfer_batch_wait(b, 10000), 0);
    assert_int_equal(ty_xfer_batch_free(b), 0);
    assert_int_equal(ty_xfer_notify_send(c.e, c.seg, msg, TY_XFER_NOTIFY_MAX + 1), TY_EMSGSIZE);
    round_teardown(&c);
    peer_stop(&peer);
}

static void test_notify(void **state)
{
    notify_after_write("tcp", false);
    notify_after_write("local", true);
}

/* ---- etcd metadata ------------------------------------------------------------------------------
 * What is checked does not depend on how loaded the machine is: etcd keeps its data in /dev/shm
 * where there is one (on a busy disk an fsync takes seconds, and every lease grant, put and revoke
 * waits for one); an etcdctl that fails (etcd slow to answer) is asked again, never read as "no
 * such key"; and the lease's expiry is timed by a watch connected before the kill, not by
 * starting etcdctl over and over (each start is itself slow on a loaded machine). */

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    socklen_t sl = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    close(fd);
    return ntohs(sa.sin_port);
}

static pid_t etcd_spawn(const char *dir, uint16_t cport, uint16_t pport, char *endpoint, size_t cap)
{
    char curls[64], purls[64], cluster[96], log[256];
    snprintf(curls, sizeof(curls), "http://127.0.0.1:%u", cport);
    snprintf(purls, sizeof(purls), "http://127.0.0.1:%u", pport);
    snprintf(cluster, sizeof(cluster), "tyxf=%s", purls);
    snprintf(log, sizeof(log), "%s.log", dir);
    snprintf(endpoint, cap, "%s", curls);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execlp("etcd", "etcd", "--name", "tyxf", "--data-dir", dir, "--listen-client-urls", curls,
               "--advertise-client-urls", curls, "--listen-peer-urls", purls,
               "--initial-advertise-peer-urls", purls, "--initial-cluster", cluster, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Start etcd on two free loopback ports with its data in dir (its log in dir.log) and write its
 * client URL to endpoint. A port taken between free_port() and etcd's bind makes etcd exit: new
 * ports are tried then. Returns etcd's pid once it answers /health, or -1. */
static pid_t etcd_start(char *endpoint, size_t cap, const char *dir)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        uint16_t cport = free_port(), pport = free_port();
        if (cport == pport)
            continue;
        pid_t pid = etcd_spawn(dir, cport, pport, endpoint, cap);
        if (pid < 0)
            return -1;
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "curl -sf -m 1 %s/health >/dev/null 2>&1", endpoint);
        uint64_t t0 = ty_clock_ms();
        bool exited = false;
        while (!exited && ty_clock_ms() - t0 < 30000) {
            if (system(cmd) == 0)
                return pid;
            exited = waitpid(pid, NULL, WNOHANG) == pid;
            usleep(100000);
        }
        if (!exited) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            fprintf(stderr, "etcd did not answer %s/health in 30 s; its log (%s.log):\n", endpoint,
                    dir);
            break;
        }
        fprintf(stderr, "etcd exited at start (ports %u, %u taken?): trying others\n", cport,
                pport);
    }
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "tail -n 20 %s.log >&2", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "(no etcd log)\n");
    return -1;
}

/* Whether etcd holds key (1) or not (0), or with prefix any key that starts with it, asked
 * through etcdctl; val (when not NULL) gets the first such key's value, one line. An etcdctl that
 * fails is asked again for up to 20 s: a failure is never taken for an answer. */
static int etcd_get(const char *endpoint, const char *key, bool prefix, char *val, size_t cap)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "ETCDCTL_API=3 etcdctl --endpoints=%s get %s%s", endpoint,
             prefix ? "--prefix " : "", key);
    uint64_t t0 = ty_clock_ms();
    for (;;) {
        static char line[2][16384];
        FILE *f = popen(cmd, "r");
        assert_non_null(f);
        int n = 0;
        while (n < 2 && fgets(line[n], sizeof(line[n]), f)) {
            line[n][strcspn(line[n], "\n")] = '\0';
            n++;
        }
        char rest[4096];
        while (fgets(rest, sizeof(rest), f))
            ;
        int st = pclose(f);
        if (st == 0) {
            if (n == 0)
                return 0;
            if (prefix ? strncmp(line[0], key, strlen(key)) : strcmp(line[0], key))
                fail_msg("etcdctl get %s answered key '%s'", key, line[0]);
            if (val)
                snprintf(val, cap, "%s", n > 1 ? line[1] : "");
            return 1;
        }
        if (ty_clock_ms() - t0 > 20000)
            fail_msg("etcdctl get %s failed for 20 s (exit status %d)", key, st);
        fprintf(stderr, "etcdctl get %s failed (exit status %d): asking again\n", key, st);
        ty_sleep_ns(200 * TY_NS_PER_MS);
    }
}

/* A running `etcdctl watch --prefix PREFIX`; it writes each event as three lines: PUT or
 * DELETE, the key, the value (empty for DELETE). */
struct etcd_watch {
    pid_t pid;
    int fd;
    size_t len;
    char buf[16384];
    char line[16384];
};

static void etcd_watch_start(struct etcd_watch *w, const char *endpoint, const char *prefix)
{
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    memset(w, 0, sizeof(*w));
    w->pid = fork();
    assert_true(w->pid >= 0);
    if (w->pid == 0) {
        char ep[160];
        snprintf(ep, sizeof(ep), "--endpoints=%s", endpoint);
        dup2(p[1], 1);
        setenv("ETCDCTL_API", "3", 1);
        execlp("etcdctl", "etcdctl", ep, "watch", "--prefix", prefix, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    w->fd = p[0];
}

/* The watch's next line, or NULL when none came by deadline_ms (ty_clock_ms(); a deadline
 * already past still takes what etcdctl has written) or etcdctl ended. */
static const char *etcd_watch_line(struct etcd_watch *w, uint64_t deadline_ms)
{
    for (;;) {
        char *nl = memchr(w->buf, '\n', w->len);
        if (nl) {
            size_t n = (size_t)(nl - w->buf);
            memcpy(w->line, w->buf, n);
            w->line[n] = '\0';
            w->len -= n + 1;
            memmove(w->buf, nl + 1, w->len);
            return w->line;
        }
        if (w->len == sizeof(w->buf))
            return NULL;
        uint64_t now = ty_clock_ms();
        struct pollfd pf = {.fd = w->fd, .events = POLLIN};
        int pr = poll(&pf, 1, deadline_ms > now ? (int)(deadline_ms - now) : 0);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return NULL;
        ssize_t r = read(w->fd, w->buf + w->len, sizeof(w->buf) - w->len);
        if (r <= 0)
            return NULL;
        w->len += (size_t)r;
    }
}

/* Reads the watch's events until one of type ("PUT" or "DELETE") on key; false when none came
 * by deadline_ms. */
static bool etcd_watch_until(struct etcd_watch *w, const char *type, const char *key,
                             uint64_t deadline_ms)
{
    const char *l;
    while ((l = etcd_watch_line(w, deadline_ms)) != NULL) {
        if (strcmp(l, "PUT") && strcmp(l, "DELETE"))
            continue; /* a value line */
        bool want = !strcmp(l, type);
        if (!(l = etcd_watch_line(w, deadline_ms)))
            return false;
        if (want && !strcmp(l, key))
            return true;
    }
    return false;
}

/* Puts sync_key (under the watch's prefix) until the watch reports it: from then on the watch
 * is connected and sees every change as it happens. */
static void etcd_watch_sync(struct etcd_watch *w, const char *endpoint, const char *sync_key)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "ETCDCTL_API=3 etcdctl --endpoints=%s put %s sync >/dev/null",
             endpoint, sync_key);
    uint64_t t0 = ty_clock_ms();
    while (ty_clock_ms() - t0 < 20000) {
        if (system(cmd) == 0 && etcd_watch_until(w, "PUT", sync_key, ty_clock_ms() + 1000))
            return;
    }
    fail_msg("etcdctl watch did not report a put of %s in 20 s", sync_key);
}

static void etcd_watch_stop(struct etcd_watch *w)
{
    kill(w->pid, SIGTERM);
    waitpid(w->pid, NULL, 0);
    close(w->fd);
}

/* The key lives under a 2 s lease: kept alive well past the TTL while the engine runs (never
 * removed meanwhile), gone within TTL + margin once the engine is SIGKILLed (no engine_free to
 * delete it). */
static void etcd_lease_check(const char *endpoint)
{
    struct peer_proc peer;
    assert_int_equal(peer_start(&peer, g_exe, "127.0.0.1", 1, NULL, endpoint, "doomed-1", false),
                     0);
    const char *key = "/tycho/xfer/segments/doomed-1";
    assert_int_equal(etcd_get(endpoint, key, false, NULL, 0), 1);
    static struct etcd_watch w;
    etcd_watch_start(&w, endpoint, key);
    etcd_watch_sync(&w, endpoint, "/tycho/xfer/segments/doomed-1.sync");
    ty_sleep_ns(5 * TY_NS_PER_S); /* 2.5 TTLs: only keepalive keeps it */
    bool lapsed = etcd_watch_until(&w, "DELETE", key, ty_clock_ms());
    if (lapsed)
        fprintf(stderr, "the lease of a running engine's key expired within 5 s\n");
    assert_false(lapsed);
    assert_int_equal(etcd_get(endpoint, key, false, NULL, 0), 1);
    peer_kill(&peer, SIGKILL);
    uint64_t t0 = ty_clock_ms();
    bool gone = etcd_watch_until(&w, "DELETE", key, t0 + 10000);
    uint64_t gone_ms = ty_clock_ms() - t0;
    etcd_watch_stop(&w);
    if (gone)
        fprintf(stderr, "etcd key of a SIGKILLed engine gone after %" PRIu64 " ms (TTL 2000)\n",
                gone_ms);
    else
        fprintf(stderr, "etcd key of a SIGKILLed engine still there after 10 s (TTL 2000)\n");
    assert_true(gone);
    assert_int_equal(etcd_get(endpoint, key, false, NULL, 0), 0);
    assert_true(gone_ms <= 2000 + 1500);
}

static void test_etcd(void **state)
{
    if (system("command -v etcd >/dev/null 2>&1") != 0) {
        fprintf(stderr, "etcd not installed: skipping\n");
        exit(77);
    }
    char dir[64], endpoint[128], cmd[512];
    snprintf(dir, sizeof(dir), "%s/tyxf-etcd-XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    assert_non_null(mkdtemp(dir));
    pid_t etcd = etcd_start(endpoint, sizeof(endpoint), dir);
    assert_true(etcd > 0);
    struct peer_proc peer;
    assert_int_equal(peer_start(&peer, g_exe, "127.0.0.1", 32, NULL, endpoint, "decode-7", false),
                     0);
    /* etcd itself (through etcdctl) holds the segment's metadata */
    static char val[16384];
    char port[32];
    snprintf(port, sizeof(port), "\"port\":%u", peer.port);
    assert_int_equal(etcd_get(endpoint, "/tycho/xfer/segments/decode-7", false, val, sizeof(val)),
                     1);
    if (!strstr(val, port))
        fail_msg("etcd's value of decode-7 lacks %s: %s", port, val);
    struct ty_xfer_engine_opts o = {
        .transport = "tcp", .etcd_endpoint = endpoint, .name = "prefill-3"};
    struct round_ctx c;
    memset(&c, 0, sizeof(c));
    c.peer = &peer;
    c.rng = 77;
    assert_int_equal(ty_xfer_engine_new(&c.e, &o), 0);
    c.local = map_buf(peer.size);
    c.shadow = calloc(1, peer.size);
    assert_int_equal(ty_xfer_mem_register(c.e, c.local, peer.size, "cpu:0"), 0);
    assert_int_equal(ty_xfer_segment_open(c.e, "decode-7", &c.seg), 0);
    struct ty_xfer_region_info regs[4];
    size_t n;
    ty_xfer_segment_regions(c.seg, regs, 4, &n);
    assert_int_equal(n, 2);
    assert_true(regs[0].addr == (peer.addr_a < peer.addr_b ? peer.addr_a : peer.addr_b));
    run_round(&c, 0, 2);
    round_check_b(&c);
    ty_xfer_segment_t *missing;
    assert_int_equal(ty_xfer_segment_open(c.e, "no-such-node", &missing), TY_ENOTFOUND);
    round_teardown(&c);
    peer_stop(&peer); /* its engine_free removes the key */
    assert_int_equal(etcd_get(endpoint, "/tycho/xfer/segments/decode-7", true, NULL, 0), 0);
    etcd_lease_check(endpoint);
    kill(etcd, SIGTERM);
    waitpid(etcd, NULL, 0);
    snprintf(cmd, sizeof(cmd), "rm -rf %s %s.log", dir, dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- rdma (needs a device: skips with 77 otherwise) ------------------------------------------ */

static void need_rdma(void)
{
    if (!ty_xfer_rdma_available()) {
        fprintf(stderr, "no active RDMA device: skipping\n");
        exit(77);
    }
}

static void test_rdma(void **state)
{
    need_rdma();
    random_rounds("rdma", "127.0.0.1", "127.0.0.1", NULL, false);
    notify_after_write("rdma", false);
    late_region_check("rdma", false);
    /* outside the peer's regions: refused, and the segment keeps serving */
    struct peer_proc peer;
    assert_int_equal(peer_start(&peer, g_exe, "127.0.0.1", 16, NULL, NULL, NULL, false), 0);
    struct round_ctx c;
    round_setup(&c, "rdma", &peer, "127.0.0.1", "127.0.0.1");
    struct ty_xfer_request bad = {TY_XFER_OP_WRITE, c.local, c.seg, peer.addr_b + peer.size - 100,
                                  4 * MiB};
    struct ty_xfer_request good = {TY_XFER_OP_WRITE, c.local, c.seg, peer.addr_b, peer.size};
    memset(c.local, 0x5A, peer.size);
    one(c.e, &bad, TY_EOUTOFRANGE);
    one(c.e, &good, 0);
    memset(c.shadow, 0x5A, peer.size);
    assert_true(peer_hash(&peer, peer.addr_b, peer.size) == XXH3_64bits(c.shadow, peer.size));
    round_teardown(&c);
    peer_stop(&peer);
}

static void test_rdma_kill(void **state)
{
    need_rdma();
    kill_scenario("rdma", false);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0)
        return peer_child_main(argc, argv);
    ssize_t n = readlink("/proc/self/exe", g_exe, sizeof(g_exe) - 1);
    if (n <= 0)
        return 1;
    g_exe[n] = '\0';
    g_mode = argc > 1 ? argv[1] : "tcp";
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest all[] = {
        cmocka_unit_test(test_tcp),  cmocka_unit_test(test_local), cmocka_unit_test(test_netns),
        cmocka_unit_test(test_oob),  cmocka_unit_test(test_kill),  cmocka_unit_test(test_notify),
        cmocka_unit_test(test_etcd), cmocka_unit_test(test_rdma),  cmocka_unit_test(test_rdma_kill),
    };
    static const char *names[] = {"tcp",    "local", "netns", "oob",      "kill",
                                  "notify", "etcd",  "rdma",  "rdma_kill"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(g_mode, names[i]) == 0)
            return _cmocka_run_group_tests(names[i], &all[i], 1, NULL, NULL);
    fprintf(stderr, "unknown mode %s\n", g_mode);
    return 2;
}
