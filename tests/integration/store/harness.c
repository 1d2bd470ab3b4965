#include "harness.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

static char g_dir[256];
static int g_seq;

const char *harness_dir(void)
{
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof(g_dir), "/tmp/ty-store-it-XXXXXX");
        if (!mkdtemp(g_dir)) {
            perror("mkdtemp");
            exit(1);
        }
    }
    return g_dir;
}

void harness_cleanup(void)
{
    if (!g_dir[0])
        return;
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cleanup of %s failed\n", g_dir);
}

static const char *store_bin(void)
{
    static char path[512];
    const char *b = getenv("TYCHO_BUILD_DIR");
    snprintf(path, sizeof(path), "%s/src/store/tycho-store", b ? b : ".");
    return path;
}

int harness_start(struct proc *p, const char *netns, const char *const *args)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->port_file, sizeof(p->port_file), "%s/ports-%d", harness_dir(), ++g_seq);
    unlink(p->port_file);
    char pf[600];
    snprintf(pf, sizeof(pf), "--port_file=%s", p->port_file);
    const char *argv[48];
    int n = 0;
    if (netns) {
        argv[n++] = "ip";
        argv[n++] = "netns";
        argv[n++] = "exec";
        argv[n++] = netns;
    }
    argv[n++] = store_bin();
    argv[n++] = pf;
    for (int i = 0; args[i] && n < 46; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    p->pid = fork();
    if (p->pid < 0)
        return -1;
    if (p->pid == 0) {
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) { /* 10 s */
        FILE *f = fopen(p->port_file, "r");
        if (f) {
            int got = fscanf(f, "master=%u node=%u", &p->master_port, &p->node_port);
            fclose(f);
            if (got == 2)
                return 0;
        }
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            fprintf(stderr, "tycho-store exited early (status %d)\n", st);
            p->pid = 0;
            return -1;
        }
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

void harness_stop(struct proc *p, int sig)
{
    if (p->pid <= 0)
        return;
    kill(p->pid, sig);
    int st;
    waitpid(p->pid, &st, 0);
    p->pid = 0;
}

void harness_fill(uint8_t *buf, size_t n, const char *key, uint32_t version)
{
    uint64_t x = XXH3_64bits_withSeed(key, strlen(key), version) | 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(buf + i, &x, 8);
    }
    for (; i < n; i++)
        buf[i] = (uint8_t)(x >> (8 * (i & 7)));
}

pid_t harness_spawn(const char *const *argv, const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (log) {
            int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                close(fd);
            }
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* A port of the kernel's ephemeral range (what bind to port 0 gives) is drawn from by every
 * daemon's outgoing connections too, so one may take it before the daemon it was meant for binds.
 * Ports are drawn at random below that range instead, checked bindable now, never twice. */
static int port_bindable(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

unsigned harness_free_port(void)
{
    static unsigned given[64];
    static int ngiven;
    unsigned low = 10000, high = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%u", &high) != 1)
            high = 32768;
        fclose(f);
    }
    static unsigned seed;
    if (!seed)
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (int tries = 0; high > low + 1000 && tries < 500; tries++) {
        unsigned p = low + (unsigned)rand_r(&seed) % (high - low);
        int dup = 0;
        for (int i = 0; i < ngiven; i++)
            dup |= given[i] == p;
        if (!dup && port_bindable(p)) {
            if (ngiven < 64)
                given[ngiven++] = p;
            return p;
        }
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) != 0) {
        perror("free port");
        exit(1);
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* The whole answer of GET /metrics on 127.0.0.1:port (malloc'ed, NUL-terminated) or NULL. */
static char *http_metrics(unsigned port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 2};
    if (fd < 0)
        return NULL;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const char req[] = "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
        close(fd);
        return NULL;
    }
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    ssize_t got;
    while (buf && (got = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)got;
        if (len + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    close(fd);
    if (buf)
        buf[len] = 0;
    return buf;
}

int harness_metric(const struct proc *p, const char *series, double *out)
{
    unsigned port = 0;
    char line[512];
    FILE *f = fopen(p->port_file, "r");
    if (!f)
        return -1;
    char *ok = fgets(line, sizeof(line), f);
    fclose(f);
    const char *mp = ok ? strstr(line, "metrics=") : NULL;
    if (!mp || sscanf(mp, "metrics=%u", &port) != 1)
        return -1;
    char *body = http_metrics(port);
    if (!body)
        return -1;
    size_t sl = strlen(series);
    int rc = -1;
    for (char *l = body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, series, sl) == 0 && l[sl] == ' ') {
            *out = strtod(l + sl + 1, NULL);
            rc = 0;
            break;
        }
    free(body);
    return rc;
}
