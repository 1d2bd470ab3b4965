#include "harness.h"

#include "tycho/transfer.h"

#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static uint64_t splitmix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint8_t pattern_byte(uint64_t seed, uint64_t off)
{
    return (uint8_t)(splitmix(seed ^ (off >> 3)) >> (8 * (off & 7)));
}

void pattern_fill(uint8_t *dst, uint64_t seed, uint64_t off, uint64_t len)
{
    uint64_t i = 0;
    while (i < len && ((off + i) & 7))
        dst[i] = pattern_byte(seed, off + i), i++;
    for (; i + 8 <= len; i += 8) {
        uint64_t w = splitmix(seed ^ ((off + i) >> 3));
        memcpy(dst + i, &w, 8); /* little-endian host: byte k is w >> 8k */
    }
    for (; i < len; i++)
        dst[i] = pattern_byte(seed, off + i);
}

int peer_start(struct peer_proc *p, const char *self_exe, const char *host, uint64_t size_mb,
               const char *netns, const char *etcd, const char *name, bool shared)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC))
        return -1;
    char size[32];
    snprintf(size, sizeof(size), "%" PRIu64, size_mb);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execl(self_exe, self_exe, "--child", host, size, netns ? netns : "-", etcd ? etcd : "-",
              name ? name : "-", shared ? "shared" : "heap", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    memset(p, 0, sizeof(*p));
    p->pid = pid;
    p->cmd_fd = in[1];
    p->reply = fdopen(out[0], "r");
    unsigned port;
    if (fscanf(p->reply, "%u %" SCNx64 " %" SCNx64 " %" SCNu64, &port, &p->addr_a, &p->addr_b,
               &p->size) != 4)
        return -1;
    p->port = (uint16_t)port;
    return 0;
}

uint64_t peer_hash(struct peer_proc *p, uint64_t addr, uint64_t len)
{
    dprintf(p->cmd_fd, "H %" PRIx64 " %" PRIu64 "\n", addr, len);
    uint64_t h = 0;
    if (fscanf(p->reply, "%" SCNx64, &h) != 1)
        return 0;
    return h;
}

int peer_check_notify(struct peer_proc *p, char *from, size_t from_cap)
{
    dprintf(p->cmd_fd, "N\n");
    int ok = -1;
    char buf[300] = "";
    if (fscanf(p->reply, "%d %299s", &ok, buf) != 2)
        return -1;
    snprintf(from, from_cap, "%s", buf);
    return ok;
}

uint64_t peer_late_region(struct peer_proc *p, uint64_t len)
{
    dprintf(p->cmd_fd, "R %" PRIu64 "\n", len);
    uint64_t addr = 0;
    if (fscanf(p->reply, "%" SCNx64, &addr) != 1)
        return 0;
    return addr;
}

void peer_stop(struct peer_proc *p)
{
    if (p->pid <= 0)
        return;
    dprintf(p->cmd_fd, "Q\n");
    close(p->cmd_fd);
    fclose(p->reply);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}

void peer_kill(struct peer_proc *p, int sig)
{
    if (p->pid > 0)
        kill(p->pid, sig);
    if (sig == SIGKILL && p->pid > 0) {
        waitpid(p->pid, NULL, 0);
        close(p->cmd_fd);
        fclose(p->reply);
        p->pid = 0;
    }
}

/* ---- child ------------------------------------------------------------------------------------
 */

static int enter_netns(const char *ns)
{
    char path[256];
    snprintf(path, sizeof(path), "/var/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0)
        return -1;
    close(fd);
    return 0;
}

static int child_notify(ty_xfer_engine_t *e)
{
    struct ty_xfer_notify n;
    for (int i = 0; i < 10000; i++) {
        if (ty_xfer_notify_poll(e, &n) == 0) {
            uint64_t addr, len, h;
            char msg[TY_XFER_NOTIFY_MAX + 1];
            memcpy(msg, n.msg, n.len);
            msg[n.len] = '\0';
            if (sscanf(msg, "%" SCNx64 " %" SCNu64 " %" SCNx64, &addr, &len, &h) != 3)
                return printf("0 %s\n", n.from), 0;
            uint64_t got = XXH3_64bits((void *)(uintptr_t)addr, len);
            return printf("%d %s\n", got == h, n.from), 0;
        }
        usleep(1000);
    }
    return printf("-1 none\n"), 0;
}

/* A registered region of `size` bytes, filled with the pattern at `seed` when fill is set. Heap
 * memory is filled before it is registered: the engine's serving threads then read it after the
 * registration's write lock, ordered after the fill (a peer learns the region only through a
 * pipe and a socket, which ThreadSanitizer cannot see). Shared memory is registered as it is
 * made; here only other processes (the local transport) touch it. */
static void *child_region(ty_xfer_engine_t *e, uint64_t size, bool shared, bool fill, uint64_t seed)
{
    void *p = NULL;
    if (shared) {
        if (ty_xfer_mem_alloc(e, size, &p) != 0)
            return NULL;
        if (fill)
            pattern_fill(p, seed, 0, size);
        return p;
    }
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (fill)
        pattern_fill(p, seed, 0, size);
    if (ty_xfer_mem_register(e, p, size, "cpu:0") != 0)
        return NULL;
    return p;
}

/* Register one more region (after peers opened us), filled with the pattern at seed 2. */
static void child_late_region(ty_xfer_engine_t *e, uint64_t len, bool shared)
{
    uint8_t *p = child_region(e, len, shared, true, PATTERN_SEED + 2);
    printf("%" PRIx64 "\n", (uint64_t)(uintptr_t)p);
}

int peer_child_main(int argc, char **argv)
{
    if (argc < 8)
        return 2;
    const char *host = argv[2], *netns = argv[4], *etcd = argv[5], *name = argv[6];
    uint64_t size = strtoull(argv[3], NULL, 10) << 20;
    bool shared = strcmp(argv[7], "shared") == 0;
    if (strcmp(netns, "-") && enter_netns(netns) != 0)
        return 3;
    struct ty_xfer_engine_opts o = {.listen_host = host, .timeout_ms = 2000, .etcd_ttl_s = 2};
    if (strcmp(etcd, "-")) {
        o.etcd_endpoint = etcd;
        o.name = name;
    }
    ty_xfer_engine_t *e;
    if (ty_xfer_engine_new(&e, &o) != 0)
        return 4;
    uint8_t *a = child_region(e, size, shared, true, PATTERN_SEED);
    uint8_t *b = child_region(e, size, shared, false, 0);
    if (!a || !b)
        return 5;
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("%u %" PRIx64 " %" PRIx64 " %" PRIu64 "\n", ty_xfer_engine_port(e),
           (uint64_t)(uintptr_t)a, (uint64_t)(uintptr_t)b, size);
    char line[256];
    while (fgets(line, sizeof(line), stdin)) {
        uint64_t addr, len;
        if (line[0] == 'H' && sscanf(line + 1, "%" SCNx64 " %" SCNu64, &addr, &len) == 2) {
            /* the parent asks after its writes were acknowledged: the snapshot orders this
             * thread after the serving threads that wrote the bytes (ty_xfer_engine_stats) */
            struct ty_xfer_stats st;
            ty_xfer_engine_stats(e, &st);
            printf("%" PRIx64 "\n", XXH3_64bits((void *)(uintptr_t)addr, len));
        } else if (line[0] == 'N') {
            child_notify(e);
        } else if (line[0] == 'R' && sscanf(line + 1, "%" SCNu64, &len) == 1) {
            child_late_region(e, len, shared);
        } else {
            break;
        }
    }
    ty_xfer_engine_free(e);
    return 0;
}
