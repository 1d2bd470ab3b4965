/* Pure pieces of the transfer engine: region table, location strings, the wire header and the
 * hello body, plus blocking socket helpers. Nothing here holds state of its own. */
#include "xfer-impl.h"

#include "tycho/errors.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- locations and regions ----------------------------------------------------------------- */

int ty__xfer_location_parse(const char *s, int *kind, int *dev)
{
    if (!s || !*s)
        s = "cpu:0";
    const char *rest;
    if (strncmp(s, "cpu", 3) == 0) {
        *kind = TY__XFER_LOC_CPU;
        rest = s + 3;
    } else if (strncmp(s, "cuda", 4) == 0) {
        *kind = TY__XFER_LOC_CUDA;
        rest = s + 4;
    } else {
        return TY_EINVAL;
    }
    if (*rest == '\0') {
        *dev = 0;
        return 0;
    }
    if (*rest != ':' || rest[1] < '0' || rest[1] > '9')
        return TY_EINVAL;
    char *end;
    long v = strtol(rest + 1, &end, 10);
    if (*end != '\0' || v < 0 || v > 1023)
        return TY_EINVAL;
    *dev = (int)v;
    return 0;
}

int ty__xfer_regions_add(struct ty__xfer_region_table *t, const struct ty__xfer_region *r)
{
    if (r->len == 0 || r->addr + r->len < r->addr)
        return TY_EINVAL;
    if (t->n >= TY_XFER_REGIONS_MAX)
        return TY_ENOSPC;
    size_t i = 0;
    while (i < t->n && t->v[i].addr < r->addr)
        i++;
    if (i > 0 && t->v[i - 1].addr + t->v[i - 1].len > r->addr)
        return TY_EINVAL;
    if (i < t->n && r->addr + r->len > t->v[i].addr)
        return TY_EINVAL;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        struct ty__xfer_region *v = realloc(t->v, cap * sizeof(*v));
        if (!v)
            abort();
        t->v = v;
        t->cap = cap;
    }
    memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof(*t->v));
    t->v[i] = *r;
    t->n++;
    return 0;
}

int ty__xfer_regions_remove(struct ty__xfer_region_table *t, uint64_t addr,
                            struct ty__xfer_region *out)
{
    for (size_t i = 0; i < t->n; i++) {
        if (t->v[i].addr == addr) {
            if (out)
                *out = t->v[i];
            memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof(*t->v));
            t->n--;
            return 0;
        }
    }
    return TY_ENOTFOUND;
}

const struct ty__xfer_region *ty__xfer_regions_find(const struct ty__xfer_region_table *t,
                                                    uint64_t addr, uint64_t len)
{
    if (len == 0 || addr + len < addr)
        return NULL;
    size_t lo = 0, hi = t->n;
    while (lo < hi) { /* first region with addr > target */
        size_t mid = (lo + hi) / 2;
        if (t->v[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    const struct ty__xfer_region *r = &t->v[lo - 1];
    if (addr + len > r->addr + r->len)
        return NULL;
    return r;
}

void ty__xfer_regions_clear(struct ty__xfer_region_table *t)
{
    free(t->v);
    t->v = NULL;
    t->n = t->cap = 0;
}

/* ---- little-endian helpers ------------------------------------------------------------------ */

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void ty__xfer_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint64_t ty__xfer_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---- header --------------------------------------------------------------------------------- */

void ty__xfer_hdr_encode(const struct ty__xfer_hdr *h, uint8_t out[TY__XFER_HDR_SIZE])
{
    put_u32(out, TY__XFER_MAGIC);
    out[4] = h->type;
    out[5] = h->flags;
    put_u16(out + 6, 0);
    put_u32(out + 8, (uint32_t)h->status);
    put_u32(out + 12, h->fence);
    ty__xfer_put_u64(out + 16, h->seq);
    ty__xfer_put_u64(out + 24, h->addr);
    ty__xfer_put_u64(out + 32, h->len);
    ty__xfer_put_u64(out + 40, h->checksum);
    ty__xfer_put_u64(out + 48, h->task_addr);
    ty__xfer_put_u64(out + 56, h->task_len);
}

int ty__xfer_hdr_decode(const uint8_t in[TY__XFER_HDR_SIZE], struct ty__xfer_hdr *h)
{
    h->magic = get_u32(in);
    h->type = in[4];
    h->flags = in[5];
    h->reserved = get_u16(in + 6);
    h->status = (int32_t)get_u32(in + 8);
    h->fence = get_u32(in + 12);
    h->seq = ty__xfer_get_u64(in + 16);
    h->addr = ty__xfer_get_u64(in + 24);
    h->len = ty__xfer_get_u64(in + 32);
    h->checksum = ty__xfer_get_u64(in + 40);
    h->task_addr = ty__xfer_get_u64(in + 48);
    h->task_len = ty__xfer_get_u64(in + 56);
    if (h->magic != TY__XFER_MAGIC || h->type < TY__XFER_MSG_HELLO ||
        h->type > TY__XFER_MSG_CUDA_IPC)
        return TY_EPROTO;
    if (h->status > 0 || h->status < -20000)
        return TY_EPROTO;
    switch (h->type) {
    case TY__XFER_MSG_HELLO:
        return h->len <= TY_XFER_NAME_MAX ? 0 : TY_EPROTO;
    case TY__XFER_MSG_NOTIFY:
    case TY__XFER_MSG_RDMA_CONNECT:
    case TY__XFER_MSG_RDMA_CONNECT_REPLY:
        return h->len <= TY_XFER_NOTIFY_MAX ? 0 : TY_EPROTO;
    case TY__XFER_MSG_HELLO_REPLY:
    case TY__XFER_MSG_FDS:
        return h->len <= (1u << 20) ? 0 : TY_EPROTO;
    case TY__XFER_MSG_CUDA_IPC:
        return h->len == TY__XFER_IPC_HANDLE + 8 ? 0 : TY_EPROTO;
    case TY__XFER_MSG_ACK:
        return 0;
    case TY__XFER_MSG_READ_RESP:
        return h->len <= TY__XFER_MAX_SLICE ? 0 : TY_EPROTO;
    default: /* WRITE, READ: the slice lies inside its task */
        if (h->len > TY__XFER_MAX_SLICE || h->addr < h->task_addr || h->addr + h->len < h->addr ||
            h->task_addr + h->task_len < h->task_addr ||
            h->addr + h->len > h->task_addr + h->task_len)
            return TY_EPROTO;
        return 0;
    }
}

/* ---- hello body ---------------------------------------------------------------------------- */

struct wbuf {
    uint8_t *p;
    size_t n, cap;
};

static uint8_t *wbuf_grow(struct wbuf *b, size_t add)
{
    if (b->n + add > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + add)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p)
            abort();
        b->p = p;
        b->cap = cap;
    }
    uint8_t *at = b->p + b->n;
    b->n += add;
    return at;
}

static void wbuf_str(struct wbuf *b, const char *s)
{
    size_t len = strlen(s);
    uint8_t *p = wbuf_grow(b, 2 + len);
    put_u16(p, (uint16_t)len);
    memcpy(p + 2, s, len);
}

void ty__xfer_hello_encode(const struct ty__xfer_hello *h, uint8_t **out, size_t *out_len)
{
    struct wbuf b = {0};
    wbuf_str(&b, h->name);
    wbuf_str(&b, h->host_id);
    wbuf_str(&b, h->unix_name);
    put_u32(wbuf_grow(&b, 4), (uint32_t)h->n_regions);
    for (size_t i = 0; i < h->n_regions; i++) {
        const struct ty_xfer_region_info *r = &h->regions[i];
        uint8_t *p = wbuf_grow(&b, 16);
        ty__xfer_put_u64(p, r->addr);
        ty__xfer_put_u64(p + 8, r->len);
        wbuf_str(&b, r->location);
        *wbuf_grow(&b, 1) = r->cuda_ipc ? 2 : r->shared ? 1 : 0; /* 1 memfd, 2 CUDA IPC */
    }
    *wbuf_grow(&b, 1) = (uint8_t)h->n_nics;
    for (size_t i = 0; i < h->n_nics; i++) {
        const struct ty__xfer_nic_info *n = &h->nics[i];
        wbuf_str(&b, n->name);
        uint8_t *p = wbuf_grow(&b, 22);
        p[0] = n->port;
        p[1] = n->link_layer;
        p[2] = n->mtu;
        p[3] = n->gid_index;
        put_u16(p + 4, n->lid);
        memcpy(p + 6, n->gid, 16);
    }
    for (size_t i = 0; i < h->n_regions * h->n_nics; i++)
        put_u32(wbuf_grow(&b, 4), h->rkeys[i]);
    *out = b.p;
    *out_len = b.n;
}

struct rbuf {
    const uint8_t *p;
    size_t n, off;
};

static int rbuf_str(struct rbuf *b, char *dst, size_t cap)
{
    if (b->n - b->off < 2)
        return TY_EPROTO;
    size_t len = get_u16(b->p + b->off);
    b->off += 2;
    if (len >= cap || b->n - b->off < len)
        return TY_EPROTO;
    memcpy(dst, b->p + b->off, len);
    dst[len] = '\0';
    if (memchr(dst, '\0', len))
        return TY_EPROTO;
    b->off += len;
    return 0;
}

static int hello_decode_nics(struct rbuf *b, struct ty__xfer_hello *h)
{
    if (b->n - b->off < 1)
        return TY_EPROTO;
    size_t n = b->p[b->off++];
    if (n > TY__XFER_RDMA_MAX_NICS)
        return TY_EPROTO;
    for (size_t i = 0; i < n; i++) {
        struct ty__xfer_nic_info *nic = &h->nics[i];
        if (rbuf_str(b, nic->name, sizeof(nic->name)) || b->n - b->off < 22)
            return TY_EPROTO;
        const uint8_t *p = b->p + b->off;
        nic->port = p[0];
        nic->link_layer = p[1];
        nic->mtu = p[2];
        nic->gid_index = p[3];
        nic->lid = get_u16(p + 4);
        memcpy(nic->gid, p + 6, 16);
        b->off += 22;
        if (nic->port == 0 ||
            (nic->link_layer != TY__XFER_LINK_IB && nic->link_layer != TY__XFER_LINK_ETH) ||
            nic->mtu < 1 || nic->mtu > 5)
            return TY_EPROTO;
    }
    h->n_nics = n;
    size_t nk = h->n_regions * n;
    if (nk == 0)
        return 0;
    if ((b->n - b->off) / 4 < nk)
        return TY_EPROTO;
    h->rkeys = calloc(nk, sizeof(*h->rkeys));
    if (!h->rkeys)
        abort();
    for (size_t i = 0; i < nk; i++, b->off += 4)
        h->rkeys[i] = get_u32(b->p + b->off);
    return 0;
}

int ty__xfer_hello_decode(const uint8_t *buf, size_t len, struct ty__xfer_hello *h)
{
    memset(h, 0, sizeof(*h));
    struct rbuf b = {buf, len, 0};
    if (rbuf_str(&b, h->name, sizeof(h->name)) || rbuf_str(&b, h->host_id, sizeof(h->host_id)) ||
        rbuf_str(&b, h->unix_name, sizeof(h->unix_name)) || b.n - b.off < 4)
        return TY_EPROTO;
    uint32_t n = get_u32(b.p + b.off);
    b.off += 4;
    if (n > TY_XFER_REGIONS_MAX)
        return TY_EPROTO;
    struct ty_xfer_region_info *regs = calloc(n ? n : 1, sizeof(*regs));
    if (!regs)
        abort();
    for (uint32_t i = 0; i < n; i++) {
        if (b.n - b.off < 16)
            goto err_free;
        regs[i].addr = ty__xfer_get_u64(b.p + b.off);
        regs[i].len = ty__xfer_get_u64(b.p + b.off + 8);
        b.off += 16;
        if (regs[i].len == 0 || regs[i].addr + regs[i].len < regs[i].addr)
            goto err_free;
        if (rbuf_str(&b, regs[i].location, sizeof(regs[i].location)) || b.n - b.off < 1)
            goto err_free;
        uint8_t shared = b.p[b.off++];
        if (shared > 2)
            goto err_free;
        regs[i].shared = shared != 0;
        regs[i].cuda_ipc = shared == 2;
    }
    h->regions = regs;
    h->n_regions = n;
    if (hello_decode_nics(&b, h) != 0 || b.off != b.n) {
        ty__xfer_hello_clear(h);
        return TY_EPROTO;
    }
    return 0;
err_free:
    free(regs);
    return TY_EPROTO;
}

void ty__xfer_hello_clear(struct ty__xfer_hello *h)
{
    free(h->regions);
    free(h->rkeys);
    h->regions = NULL;
    h->rkeys = NULL;
    h->n_regions = 0;
    h->n_nics = 0;
}

/* ---- sockets -------------------------------------------------------------------------------- */

int ty__xfer_sendv_all(int fd, struct iovec *iov, int iovcnt)
{
    while (iovcnt > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN ? TY_ETIMEDOUT : -errno;
        }
        while (iovcnt > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

int ty__xfer_recv_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_WAITALL);
        if (n == 0)
            return TY_ECONNRESET;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN ? TY_ETIMEDOUT : -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

#define LOWAT_MAX (1 << 20)

static void lowat_set(int fd, int *lowat, int v)
{
    if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof(v)) == 0)
        *lowat = v;
}

int ty__xfer_recv_lowat(int fd, void *buf, size_t len, int *lowat, int timeout_ms)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return TY_ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        /* nothing buffered: wait for min(missing, cap) bytes. Lower the mark when it exceeds
         * what is missing (else the wait could hang); raise it when far below the target. */
        int want = len < LOWAT_MAX ? (int)len : LOWAT_MAX;
        if ((size_t)*lowat > len || *lowat < want / 2)
            lowat_set(fd, lowat, want);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int rc = poll(&pfd, 1, timeout_ms);
        if (rc == 0)
            return TY_ETIMEDOUT;
        if (rc < 0 && errno != EINTR)
            return -errno;
    }
    return 0;
}

void ty__xfer_lowat_reset(int fd, int *lowat)
{
    if (*lowat != 1)
        lowat_set(fd, lowat, 1);
}

int ty__xfer_send_status(int fd, uint8_t type, uint64_t seq, int status)
{
    struct ty__xfer_hdr h = {.type = type, .seq = seq, .status = status};
    uint8_t hb[TY__XFER_HDR_SIZE];
    ty__xfer_hdr_encode(&h, hb);
    struct iovec iov = {hb, sizeof(hb)};
    return ty__xfer_sendv_all(fd, &iov, 1);
}

int ty__xfer_drain(int fd, uint64_t len)
{
    uint8_t scratch[16384];
    while (len > 0) {
        size_t n = len < sizeof(scratch) ? (size_t)len : sizeof(scratch);
        int rc = ty__xfer_recv_all(fd, scratch, n);
        if (rc)
            return rc;
        len -= n;
    }
    return 0;
}

void ty__xfer_sock_timeouts(int fd, uint32_t timeout_ms)
{
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static int connect_wait(int fd, uint32_t timeout_ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int rc;
    do {
        rc = poll(&pfd, 1, (int)timeout_ms);
    } while (rc < 0 && errno == EINTR);
    if (rc == 0)
        return TY_ETIMEDOUT;
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
    return soerr ? -soerr : 0;
}

int ty__xfer_tcp_connect(const char *host, uint16_t port, uint32_t timeout_ms)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
        if (getaddrinfo(host, NULL, &hints, &ai) != 0)
            return TY_EHOSTUNREACH;
        sa.sin_addr = ((struct sockaddr_in *)ai->ai_addr)->sin_addr;
        freeaddrinfo(ai);
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return ty_errno();
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    if (rc < 0 && errno != EINPROGRESS) {
        rc = ty_errno();
        goto err_close;
    }
    if (rc < 0 && (rc = connect_wait(fd, timeout_ms)) != 0)
        goto err_close;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
err_close:
    close(fd);
    return rc;
}
