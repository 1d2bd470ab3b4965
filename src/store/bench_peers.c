/* store-bench peers: Redis (RESP2) and memcached (text protocol) clients over loopback TCP, and
 * starting / stopping their servers (bench-impl.h). */
#include "bench-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

struct conn {
    int fd;
    uint8_t *val; /* value buffer, max_len */
    size_t max_len;
    char rbuf[1 << 16]; /* reply bytes not consumed yet */
    size_t rlen, roff;
};

static unsigned free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    unsigned port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &l) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int dial(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0)
        return ty_errno();
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        int rc = ty_errno();
        close(fd);
        return rc;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static int spawn_wait(struct bench_peer *p, char *const *argv)
{
    if (access(argv[0], X_OK) != 0)
        return TY_ENOTFOUND;
    p->pid = fork();
    if (p->pid < 0)
        return ty_errno();
    if (p->pid == 0) {
        freopen("/dev/null", "w", stdout);
        execv(argv[0], argv);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) { /* 5 s */
        int fd = dial(p->port);
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        ty_sleep_ns(10 * 1000000ull);
    }
    ty__store_bench_peer_stop(p);
    return TY_ETIMEDOUT;
}

int ty__store_bench_redis_start(struct bench_peer *p)
{
    p->port = free_port();
    char port[16];
    snprintf(port, sizeof(port), "%u", p->port);
    char *argv[] = {"/usr/bin/redis-server",
                    "--port",
                    port,
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "no",
                    "--maxmemory",
                    "0",
                    NULL};
    return spawn_wait(p, argv);
}

int ty__store_bench_memcached_start(struct bench_peer *p, uint64_t max_item)
{
    p->port = free_port();
    char port[16], item[32];
    snprintf(port, sizeof(port), "%u", p->port);
    snprintf(item, sizeof(item), "%llum", (unsigned long long)((max_item >> 20) + 2));
    char *argv[] = {"/usr/bin/memcached",
                    "-p",
                    port,
                    "-l",
                    "127.0.0.1",
                    "-U",
                    "0",
                    "-m",
                    "2048",
                    "-I",
                    item,
                    "-t",
                    "4",
                    "-u",
                    "root",
                    NULL};
    return spawn_wait(p, argv);
}

void ty__store_bench_peer_stop(struct bench_peer *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGTERM);
        waitpid(p->pid, NULL, 0);
    }
    p->pid = 0;
}

/* ---- connection helpers ---------------------------------------------------------------- */

static void *conn_new(void *shared, size_t max_len)
{
    const struct bench_peer *p = shared;
    int fd = dial(p->port);
    if (fd < 0)
        return NULL;
    struct conn *c = calloc(1, sizeof(*c));
    c->val = malloc(max_len + 2);
    if (!c || !c->val) {
        close(fd);
        free(c);
        return NULL;
    }
    c->fd = fd;
    c->max_len = max_len;
    return c;
}

static void conn_free(void *ctx)
{
    struct conn *c = ctx;
    close(c->fd);
    free(c->val);
    free(c);
}

static uint8_t *conn_buf(void *ctx)
{
    return ((struct conn *)ctx)->val;
}

static int send_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t w = writev(fd, iov, n);
        if (w < 0)
            return ty_errno();
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

/* Read exactly n bytes (from the buffer first). */
static int read_n(struct conn *c, void *out, size_t n)
{
    uint8_t *o = out;
    size_t have = c->rlen - c->roff;
    size_t k = have < n ? have : n;
    memcpy(o, c->rbuf + c->roff, k);
    c->roff += k;
    while (k < n) {
        ssize_t r = read(c->fd, o + k, n - k);
        if (r <= 0)
            return r == 0 ? TY_ECONNRESET : ty_errno();
        k += (size_t)r;
    }
    return 0;
}

/* Read one CRLF-terminated line (without CRLF) into line. */
static int read_line(struct conn *c, char *line, size_t cap)
{
    size_t n = 0;
    for (;;) {
        if (c->roff == c->rlen) {
            ssize_t r = read(c->fd, c->rbuf, sizeof(c->rbuf));
            if (r <= 0)
                return r == 0 ? TY_ECONNRESET : ty_errno();
            c->rlen = (size_t)r;
            c->roff = 0;
        }
        char ch = c->rbuf[c->roff++];
        if (ch == '\n' && n > 0 && line[n - 1] == '\r') {
            line[n - 1] = 0;
            return 0;
        }
        if (n + 1 >= cap)
            return TY_EPROTO;
        line[n++] = ch;
    }
}

/* ---- Redis ----------------------------------------------------------------------------------- */

static int redis_put(void *ctx, const char *key, size_t len)
{
    struct conn *c = ctx;
    char hdr[128], line[128];
    int hl = snprintf(hdr, sizeof(hdr), "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n", strlen(key),
                      key, len);
    struct iovec iov[3] = {{hdr, (size_t)hl}, {c->val, len}, {"\r\n", 2}};
    int rc = send_all(c->fd, iov, 3);
    if (rc == 0)
        rc = read_line(c, line, sizeof(line));
    return rc == 0 && strcmp(line, "+OK") != 0 ? TY_EREMOTE : rc;
}

static int redis_get(void *ctx, const char *key, size_t len)
{
    struct conn *c = ctx;
    char hdr[128], line[128];
    int hl = snprintf(hdr, sizeof(hdr), "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n", strlen(key), key);
    struct iovec iov[1] = {{hdr, (size_t)hl}};
    int rc = send_all(c->fd, iov, 1);
    if (rc == 0)
        rc = read_line(c, line, sizeof(line));
    if (rc != 0)
        return rc;
    long n = line[0] == '$' ? atol(line + 1) : -2;
    if (n < 0)
        return n == -1 ? TY_ENOTFOUND : TY_EPROTO;
    if ((size_t)n != len || (size_t)n > c->max_len)
        return TY_EPROTO;
    rc = read_n(c, c->val, (size_t)n + 2);
    return rc;
}

static int redis_clear(void *shared)
{
    struct conn *c = conn_new(shared, 16);
    if (!c)
        return TY_ECONNREFUSED;
    char line[64];
    struct iovec iov[1] = {{"*1\r\n$8\r\nFLUSHALL\r\n", 18}};
    int rc = send_all(c->fd, iov, 1);
    if (rc == 0)
        rc = read_line(c, line, sizeof(line));
    conn_free(c);
    return rc;
}

const struct bench_drv ty__store_bench_redis = {.name = "redis",
                                                .ctx_new = conn_new,
                                                .ctx_free = conn_free,
                                                .buf = conn_buf,
                                                .put = redis_put,
                                                .get = redis_get,
                                                .clear = redis_clear};

/* ---- memcached ------------------------------------------------------------------------------- */

static int mc_put(void *ctx, const char *key, size_t len)
{
    struct conn *c = ctx;
    char hdr[300], line[128];
    int hl = snprintf(hdr, sizeof(hdr), "set %s 0 0 %zu\r\n", key, len);
    struct iovec iov[3] = {{hdr, (size_t)hl}, {c->val, len}, {"\r\n", 2}};
    int rc = send_all(c->fd, iov, 3);
    if (rc == 0)
        rc = read_line(c, line, sizeof(line));
    return rc == 0 && strcmp(line, "STORED") != 0 ? TY_EREMOTE : rc;
}

static int mc_get(void *ctx, const char *key, size_t len)
{
    struct conn *c = ctx;
    char hdr[300], line[400];
    int hl = snprintf(hdr, sizeof(hdr), "get %s\r\n", key);
    struct iovec iov[1] = {{hdr, (size_t)hl}};
    int rc = send_all(c->fd, iov, 1);
    if (rc == 0)
        rc = read_line(c, line, sizeof(line));
    if (rc != 0)
        return rc;
    if (strcmp(line, "END") == 0)
        return TY_ENOTFOUND;
    unsigned long flags, n;
    char k[256];
    if (sscanf(line, "VALUE %255s %lu %lu", k, &flags, &n) != 3 || n != len || n > c->max_len)
        return TY_EPROTO;
    rc = read_n(c, c->val, n + 2);
    if (rc == 0)
        rc = read_line(c, line, sizeof(line)); /* END */
    return rc;
}

static int mc_clear(void *shared)
{
    struct conn *c = conn_new(shared, 16);
    if (!c)
        return TY_ECONNREFUSED;
    char line[64];
    struct iovec iov[1] = {{"flush_all\r\n", 11}};
    int rc = send_all(c->fd, iov, 1);
    if (rc == 0)
        rc = read_line(c, line, sizeof(line));
    conn_free(c);
    return rc;
}

const struct bench_drv ty__store_bench_memcached = {.name = "memcached",
                                                    .ctx_new = conn_new,
                                                    .ctx_free = conn_free,
                                                    .buf = conn_buf,
                                                    .put = mc_put,
                                                    .get = mc_get,
                                                    .clear = mc_clear};
