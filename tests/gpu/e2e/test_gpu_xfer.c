/* The transfer engine between two processes on one GPU host, device memory on both sides:
 * what a cuda prefill node and a cuda decode node on one host do with their KV pages.
 *
 * A child process (this binary with --child, started by fork + exec before any CUDA call here)
 * registers 64 MiB of device memory filled with a known pattern and serves; this process opens
 * its segment with transport auto (expected to pick CUDA IPC: "cuda_ipc") and then with tcp (the
 * pinned staging path), and for each: reads ranges of odd sizes into device memory and into
 * shared host memory and compares them with the pattern; writes ranges from device memory and
 * compares the child's hash of what landed; checks that a range outside the peer's memory fails
 * and that a killed peer fails new tasks within the engine's 5 s peer timeout. Exits 77
 * without a CUDA device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/transfer.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#define MiB       (1ull << 20)
#define PEER_SIZE (64 * MiB)
#define LOCAL     (16 * MiB)

static char g_exe[4096];

/* The byte at offset i of the peer's buffer (seed 1) or of what we write (seed 2). */
static uint8_t pattern(uint64_t seed, uint64_t i)
{
    uint64_t x = (i + seed * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
    return (uint8_t)(x >> 56);
}

static void pattern_fill(uint8_t *p, uint64_t seed, uint64_t off, uint64_t len)
{
    for (uint64_t i = 0; i < len; i++)
        p[i] = pattern(seed, off + i);
}

/* ---- the peer process ------------------------------------------------------------------------ */

static int child_main(void)
{
    ty_xfer_engine_t *e;
    struct ty_xfer_engine_opts eo = {.listen_host = "127.0.0.1"};
    void *d = NULL;
    uint8_t *h = malloc(PEER_SIZE);
    if (!h || ty_xfer_engine_new(&e, &eo) || cudaMalloc(&d, PEER_SIZE) != cudaSuccess)
        return 1;
    pattern_fill(h, 1, 0, PEER_SIZE);
    if (cudaMemcpy(d, h, PEER_SIZE, cudaMemcpyHostToDevice) != cudaSuccess ||
        ty_xfer_mem_register(e, d, PEER_SIZE, "cuda:0"))
        return 1;
    printf("%s %" PRIxPTR "\n", ty_xfer_engine_name(e), (uintptr_t)d);
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof(line), stdin)) { /* "hash OFF LEN": XXH3 of that device range */
        uint64_t off, len;
        if (sscanf(line, "hash %" SCNu64 " %" SCNu64, &off, &len) != 2 || off + len > PEER_SIZE)
            break;
        if (cudaMemcpy(h, (uint8_t *)d + off, len, cudaMemcpyDeviceToHost) != cudaSuccess)
            return 1;
        printf("%016" PRIx64 "\n", (uint64_t)XXH3_64bits(h, len));
        fflush(stdout);
    }
    ty_xfer_mem_unregister(e, d);
    ty_xfer_engine_free(e);
    cudaFree(d);
    free(h);
    return 0;
}

struct peer {
    pid_t pid;
    FILE *to, *from;
    char name[128];
    uint64_t addr;
};

static void peer_start(struct peer *p)
{
    int in[2], out[2];
    assert_int_equal(pipe2(in, O_CLOEXEC), 0);
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execl(g_exe, g_exe, "--child", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->to = fdopen(in[1], "w");
    p->from = fdopen(out[0], "r");
    assert_int_equal(fscanf(p->from, "%127s %" SCNx64, p->name, &p->addr), 2);
}

static uint64_t peer_hash(struct peer *p, uint64_t off, uint64_t len)
{
    uint64_t h = 0;
    fprintf(p->to, "hash %" PRIu64 " %" PRIu64 "\n", off, len);
    fflush(p->to);
    assert_int_equal(fscanf(p->from, "%" SCNx64, &h), 1);
    return h;
}

static void peer_stop(struct peer *p)
{
    int st;
    if (p->to)
        fclose(p->to);
    if (p->from)
        fclose(p->from);
    waitpid(p->pid, &st, 0);
}

/* ---- checks ---------------------------------------------------------------------------------- */

static int run_batch(ty_xfer_engine_t *e, const struct ty_xfer_request *r, size_t n)
{
    ty_xfer_batch_t *b;
    assert_int_equal(ty_xfer_batch_new(e, n, &b), 0);
    assert_int_equal(ty_xfer_batch_submit(b, r, n), 0);
    int rc = ty_xfer_batch_wait(b, 10000);
    assert_int_not_equal(rc, TY_EBUSY); /* every task ends in bounded time */
    assert_int_equal(ty_xfer_batch_free(b), 0);
    return rc;
}

/* 32 reads of odd sizes (1 B .. 1 MiB + 3) from random peer offsets into `local` (device when
 * dev), packed one after another; each compared with the pattern. */
static void check_reads(ty_xfer_engine_t *e, ty_xfer_segment_t *seg, uint64_t remote,
                        uint8_t *local, bool dev)
{
    enum { N = 32 };
    struct ty_xfer_request r[N];
    uint64_t rng = 12345, off[N], len[N], pos = 0;
    for (int i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        len[i] = i == 0 ? 1 : (rng >> 40) % (MiB + 4);
        off[i] = (rng >> 13) % (PEER_SIZE - len[i]);
        r[i] = (struct ty_xfer_request){TY_XFER_OP_READ, local + pos, seg, remote + off[i], len[i]};
        pos += len[i];
    }
    assert_true(pos <= LOCAL);
    assert_int_equal(run_batch(e, r, N), 0);
    uint8_t *got = malloc(pos), *want = malloc(MiB + 4);
    if (dev)
        assert_int_equal(cudaMemcpy(got, local, pos, cudaMemcpyDeviceToHost), cudaSuccess);
    else
        memcpy(got, local, pos);
    pos = 0;
    for (int i = 0; i < N; i++) {
        pattern_fill(want, 1, off[i], len[i]);
        if (memcmp(got + pos, want, len[i]) != 0)
            fail_msg("read %d (%" PRIu64 " bytes at %" PRIu64 ") into %s memory differs", i,
                     len[i], off[i], dev ? "device" : "host");
        pos += len[i];
    }
    free(got);
    free(want);
}

/* 16 writes of 1 MiB from device memory to the peer's [32 MiB, 48 MiB), hashed by the peer. */
static void check_writes(ty_xfer_engine_t *e, ty_xfer_segment_t *seg, struct peer *p,
                         uint8_t *dlocal)
{
    uint8_t *src = malloc(LOCAL);
    pattern_fill(src, 2, 0, LOCAL);
    assert_int_equal(cudaMemcpy(dlocal, src, LOCAL, cudaMemcpyHostToDevice), cudaSuccess);
    struct ty_xfer_request r[16];
    for (int i = 0; i < 16; i++)
        r[i] = (struct ty_xfer_request){TY_XFER_OP_WRITE, dlocal + i * MiB, seg,
                                        p->addr + 32 * MiB + i * MiB, MiB};
    assert_int_equal(run_batch(e, r, 16), 0);
    assert_true(peer_hash(p, 32 * MiB, LOCAL) == XXH3_64bits(src, LOCAL));
    assert_true(peer_hash(p, 0, MiB) != XXH3_64bits(src, MiB)); /* the rest untouched */
    free(src);
}

static void scenario(const char *transport, const char *expect)
{
    struct peer p = {0};
    peer_start(&p);
    ty_xfer_engine_t *e;
    struct ty_xfer_engine_opts eo = {.listen_host = "127.0.0.1", .transport = transport};
    assert_int_equal(ty_xfer_engine_new(&e, &eo), 0);
    void *dlocal, *hlocal;
    assert_int_equal(cudaMalloc(&dlocal, LOCAL), cudaSuccess);
    assert_int_equal(ty_xfer_mem_register(e, dlocal, LOCAL, "cuda:0"), 0);
    assert_int_equal(ty_xfer_mem_alloc(e, LOCAL, &hlocal), 0);
    ty_xfer_segment_t *seg;
    assert_int_equal(ty_xfer_segment_open(e, p.name, &seg), 0);
    fprintf(stderr, "transport %s: segment served by %s\n", transport,
            ty_xfer_segment_transport(seg));
    assert_string_equal(ty_xfer_segment_transport(seg), expect);

    check_reads(e, seg, p.addr, dlocal, true);
    check_reads(e, seg, p.addr, hlocal, false);
    check_writes(e, seg, &p, dlocal);

    /* outside the peer's memory: refused, nothing else happens */
    struct ty_xfer_request out = {TY_XFER_OP_READ, dlocal, seg, p.addr + PEER_SIZE - 10, 20};
    assert_int_not_equal(run_batch(e, &out, 1), 0);

    /* the peer dies: new tasks fail within 5 s, none hangs */
    kill(p.pid, SIGKILL);
    peer_stop(&p);
    uint64_t t0 = ty_clock_ns();
    struct ty_xfer_request r = {TY_XFER_OP_WRITE, dlocal, seg, p.addr, MiB};
    int rc = 0;
    for (int i = 0; i < 20 && rc == 0; i++) /* tcp may take a moment to see the reset */
        if ((rc = run_batch(e, &r, 1)) == 0)
            ty_sleep_ns(100 * TY_NS_PER_MS);
    assert_int_not_equal(rc, 0);
    assert_true(ty_clock_ns() - t0 < 6 * TY_NS_PER_S); /* the engine's 5 s peer timeout, at most */

    ty_xfer_segment_close(e, seg);
    ty_xfer_mem_unregister(e, dlocal);
    ty_xfer_mem_release(e, hlocal);
    ty_xfer_engine_free(e);
    cudaFree(dlocal);
}

static void test_cuda_ipc(void **state)
{
    scenario("auto", "cuda_ipc");
}

static void test_tcp_staging(void **state)
{
    scenario("tcp", "tcp");
}

/* The same process: a segment opened by its own name copies device to device. */
static void test_self(void **state)
{
    ty_xfer_engine_t *e;
    struct ty_xfer_engine_opts eo = {.listen_host = "127.0.0.1"};
    assert_int_equal(ty_xfer_engine_new(&e, &eo), 0);
    uint8_t *a, *b;
    assert_int_equal(cudaMalloc((void **)&a, MiB), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&b, MiB), cudaSuccess);
    uint8_t *h = malloc(MiB), *got = malloc(MiB);
    pattern_fill(h, 1, 0, MiB);
    assert_int_equal(cudaMemcpy(a, h, MiB, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemset(b, 0, MiB), cudaSuccess);
    assert_int_equal(ty_xfer_mem_register(e, a, MiB, "cuda:0"), 0);
    assert_int_equal(ty_xfer_mem_register(e, b, MiB, "cuda:0"), 0);
    ty_xfer_segment_t *seg;
    assert_int_equal(ty_xfer_segment_open(e, ty_xfer_engine_name(e), &seg), 0);
    struct ty_xfer_request r = {TY_XFER_OP_WRITE, a + 7, seg, (uintptr_t)b + 3, MiB - 7};
    assert_int_equal(run_batch(e, &r, 1), 0);
    assert_int_equal(cudaMemcpy(got, b, MiB, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(got + 3, h + 7, MiB - 7);
    ty_xfer_segment_close(e, seg);
    ty_xfer_mem_unregister(e, a);
    ty_xfer_mem_unregister(e, b);
    ty_xfer_engine_free(e);
    cudaFree(a);
    cudaFree(b);
    free(h);
    free(got);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0)
        return child_main();
    ssize_t n = readlink("/proc/self/exe", g_exe, sizeof(g_exe) - 1);
    if (n <= 0)
        return 1;
    g_exe[n] = '\0';
    signal(SIGPIPE, SIG_IGN);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("test_gpu_xfer: no CUDA device, skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_ipc),
        cmocka_unit_test(test_tcp_staging),
        cmocka_unit_test(test_self),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
