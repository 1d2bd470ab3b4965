/* The raw loopback limit that a streaming front works against (bench/serve/front.sh): N TCP
 * connections over 127.0.0.1, one thread writing FRAME-byte frames to them in turn, K frames
 * per write() call, another reading them all with epoll. Prints the frames per second moved,
 * which bounds a server that makes one write per streamed token (K = 1) on this machine.
 *
 * usage: loopback N FRAME K ROUNDS   (prints: frames_per_s writes_per_s) */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int n, frame, k, rounds;
static int *wfd;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *writer(void *arg)
{
    (void)arg;
    char *buf = malloc((size_t)frame * (size_t)k);
    memset(buf, 'x', (size_t)frame * (size_t)k);
    for (int r = 0; r < rounds; r += k)
        for (int i = 0; i < n; i++) {
            size_t len = (size_t)frame * (size_t)k, off = 0;
            while (off < len) {
                ssize_t w = write(wfd[i], buf + off, len - off);
                if (w < 0 && errno != EINTR)
                    exit(1);
                off += w > 0 ? (size_t)w : 0;
            }
        }
    free(buf);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s N FRAME K ROUNDS\n", argv[0]);
        return 2;
    }
    n = atoi(argv[1]), frame = atoi(argv[2]), k = atoi(argv[3]), rounds = atoi(argv[4]);
    if (n < 1 || frame < 1 || k < 1 || rounds < k)
        return 2;
    rounds -= rounds % k;
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t sl = sizeof(sa);
    if (bind(l, (struct sockaddr *)&sa, sizeof(sa)) || listen(l, 4096) ||
        getsockname(l, (struct sockaddr *)&sa, &sl))
        return 1;
    wfd = calloc((size_t)n, sizeof(int));
    int *rfd = calloc((size_t)n, sizeof(int)), ep = epoll_create1(0);
    for (int i = 0; i < n; i++) {
        rfd[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(rfd[i], (struct sockaddr *)&sa, sizeof(sa)) ||
            (wfd[i] = accept(l, NULL, NULL)) < 0)
            return 1;
        setsockopt(wfd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* as the server */
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = rfd[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, rfd[i], &ev);
    }
    long long want = (long long)n * rounds * frame, got = 0;
    pthread_t t;
    double t0 = now();
    pthread_create(&t, NULL, writer, NULL);
    static char buf[1 << 16];
    struct epoll_event evs[256];
    while (got < want) {
        int m = epoll_wait(ep, evs, 256, 1000);
        for (int i = 0; i < m; i++) {
            ssize_t r = read(evs[i].data.fd, buf, sizeof(buf));
            got += r > 0 ? r : 0;
        }
    }
    double dt = now() - t0;
    pthread_join(t, NULL);
    printf("%.0f %.0f\n", (double)n * rounds / dt, (double)n * rounds / k / dt);
    return 0;
}
