/* Local transport: same process by memcpy against our own region table; same host, other
 * process through shared memory or CUDA IPC. A peer's memfd-backed regions come over its unix
 * socket (SOCK_SEQPACKET, abstract name from the hello) as SCM_RIGHTS, and are mapped here, so a
 * host task is one memcpy in the submitting thread: the task is DONE when submit returns. Its
 * device regions (cuda:N) come as CUDA IPC handles and are opened here; a task whose either side
 * is device memory is a cudaMemcpyAsync on the peer's own stream (cuda.c's copy queue), and the
 * tasks a batch queued complete together after their copies (flush). Bounds are checked against
 * the mapped regions (nothing else is reachable); a task outside them first asks the peer for its
 * current regions again (regions registered after the open become reachable, released ones are
 * unmapped). The socket stays open for ordered notifications and as a liveness signal: a hung-up
 * peer fails new tasks with ECONNRESET. Threading: submit may run on many threads at once
 * (copies hold maps_lock for reading); the socket (notify, refresh) serializes on `mu`, taken
 * before maps_lock; `qmu` (creating the copy queue) is taken last and nothing is taken under it.
 */
#include "xfer-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

struct local_map {
    uint64_t remote;
    uint64_t len;
    uint8_t *ptr;
    void *ipc_base; /* device memory: the opened CUDA IPC allocation (NULL: a memfd mapping) */
};

struct local_peer {
    ty_xfer_engine_t *e;
    bool self;
    int fd;
    pthread_mutex_t mu;         /* serializes requests on fd */
    pthread_rwlock_t maps_lock; /* guards n, maps; held for reading while copying */
    size_t n;
    struct local_map *maps; /* sorted by remote */
    pthread_mutex_t qmu;    /* guards creating q */
    struct ty__xfer_cuda_q *q; /* device copies (CUDA builds), made at the first one */
};

bool ty__xfer_shmem_thp(void)
{
    char buf[128] = {0};
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *sel = strchr(buf, '[');
    return sel && strncmp(sel, "[never]", 7) != 0 && strncmp(sel, "[deny]", 6) != 0;
}

int ty__xfer_memfd_alloc(size_t len, int *fd, void **addr)
{
    int f = memfd_create("tycho-xfer", MFD_CLOEXEC);
    if (f < 0)
        return ty_errno();
    if (ftruncate(f, (off_t)len) < 0) {
        int rc = ty_errno();
        close(f);
        return rc == TY_EFBIG || rc == TY_EINVAL ? TY_ENOMEM : rc;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (p == MAP_FAILED) {
        close(f);
        return TY_ENOMEM;
    }
    madvise(p, len, MADV_HUGEPAGE);
    *fd = f;
    *addr = p;
    return 0;
}

static socklen_t abstract_addr(struct sockaddr_un *sa, const char *name)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    size_t n = strlen(name);
    if (n > sizeof(sa->sun_path) - 2)
        n = sizeof(sa->sun_path) - 2;
    memcpy(sa->sun_path + 1, name, n);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int ty__xfer_local_listen(ty_xfer_engine_t *e)
{
    static _Atomic unsigned counter;
    snprintf(e->unix_name, sizeof(e->unix_name), "tycho-xfer/%d/%u/%u", (int)getpid(), e->port,
             atomic_fetch_add(&counter, 1));
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return ty_errno();
    struct sockaddr_un sa;
    socklen_t sl = abstract_addr(&sa, e->unix_name);
    if (bind(fd, (struct sockaddr *)&sa, sl) < 0 || listen(fd, 64) < 0) {
        int rc = ty_errno();
        close(fd);
        return rc;
    }
    e->unix_fd = fd;
    return 0;
}

/* ---- messages on the seqpacket socket ------------------------------------------------------- */

static int msg_send(int fd, const struct ty__xfer_hdr *h, const void *body, size_t len, int pass)
{
    uint8_t hb[TY__XFER_HDR_SIZE];
    ty__xfer_hdr_encode(h, hb);
    struct iovec iov[2] = {{hb, sizeof(hb)}, {(void *)body, len}};
    union {
        struct cmsghdr c;
        char buf[CMSG_SPACE(sizeof(int))];
    } cm;
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
    if (pass >= 0) {
        memset(&cm, 0, sizeof(cm));
        m.msg_control = cm.buf;
        m.msg_controllen = sizeof(cm.buf);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pass, sizeof(int));
    }
    ssize_t n;
    do {
        n = sendmsg(fd, &m, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == EAGAIN ? TY_ETIMEDOUT : ty_errno();
    return 0;
}

/* Receive one message: header, up to cap body bytes, and an fd when one was passed (else -1). */
static int msg_recv(int fd, struct ty__xfer_hdr *h, void *body, size_t cap, size_t *len, int *got)
{
    uint8_t buf[TY__XFER_HDR_SIZE + TY_XFER_NOTIFY_MAX + TY_XFER_NAME_MAX + 1];
    union {
        struct cmsghdr c;
        char b[CMSG_SPACE(sizeof(int))];
    } cm;
    struct iovec iov = {buf, sizeof(buf)};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof(cm.b)};
    ssize_t n;
    do {
        n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n == 0)
        return TY_ECONNRESET;
    if (n < 0)
        return errno == EAGAIN ? TY_ETIMEDOUT : ty_errno();
    *got = -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
        memcpy(got, CMSG_DATA(c), sizeof(int));
    if (n < TY__XFER_HDR_SIZE || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
        ty__xfer_hdr_decode(buf, h) != 0 || h->len != (uint64_t)n - TY__XFER_HDR_SIZE ||
        h->len > cap) {
        if (*got >= 0)
            close(*got);
        *got = -1;
        return TY_EPROTO;
    }
    memcpy(body, buf + TY__XFER_HDR_SIZE, (size_t)h->len);
    *len = (size_t)h->len;
    return 0;
}

/* ---- server side -------------------------------------------------------------------------- */

/* Every region a peer can reach: memfds as FDS messages, device regions as CUDA_IPC. */
static int serve_fds(ty_xfer_engine_t *e, int fd)
{
    pthread_rwlock_rdlock(&e->regions_lock);
    int rc = 0;
    uint64_t count = 0;
    for (size_t i = 0; i < e->regions.n && rc == 0; i++) {
        const struct ty__xfer_region *r = &e->regions.v[i];
        if (r->memfd >= 0) {
            struct ty__xfer_hdr h = {.type = TY__XFER_MSG_FDS, .addr = r->addr, .seq = r->len};
            rc = msg_send(fd, &h, NULL, 0, r->memfd);
        } else if (r->ipc) {
            uint8_t body[TY__XFER_IPC_HANDLE + 8];
            memcpy(body, r->ipc_handle, TY__XFER_IPC_HANDLE);
            ty__xfer_put_u64(body + TY__XFER_IPC_HANDLE, r->ipc_offset);
            struct ty__xfer_hdr h = {
                .type = TY__XFER_MSG_CUDA_IPC, .addr = r->addr, .seq = r->len, .len = sizeof(body)};
            rc = msg_send(fd, &h, body, sizeof(body), -1);
        } else {
            continue;
        }
        count++;
    }
    pthread_rwlock_unlock(&e->regions_lock);
    struct ty__xfer_hdr done = {.type = TY__XFER_MSG_ACK, .addr = count};
    return rc ? rc : msg_send(fd, &done, NULL, 0, -1);
}

void ty__xfer_local_serve(ty_xfer_engine_t *e, struct ty__xfer_inbound *in)
{
    uint8_t body[TY_XFER_NOTIFY_MAX];
    struct ty__xfer_hdr h;
    size_t len;
    int passed, rc;
    /* the abstract socket is reachable by every process in the network namespace: it hands out
     * the KV memory itself, so the peer proves the cluster secret first */
    if (ty__xfer_auth(e, in->fd, true, "a local peer") != 0)
        return;
    atomic_store(&in->proven, true);
    ty__xfer_sock_timeouts(in->fd, e->timeout_ms);
    if ((rc = msg_recv(in->fd, &h, body, TY_XFER_NAME_MAX, &len, &passed)) != 0 ||
        h.type != TY__XFER_MSG_HELLO || passed >= 0)
        return;
    memcpy(in->peer_name, body, len);
    in->peer_name[len] = '\0';
    if (serve_fds(e, in->fd) != 0)
        return;
    ty__xfer_sock_timeouts(in->fd, 0);
    while (!atomic_load(&e->stopping)) {
        if ((rc = msg_recv(in->fd, &h, body, sizeof(body), &len, &passed)) != 0)
            break;
        if (passed < 0 && h.type == TY__XFER_MSG_FDS) { /* refresh: send the regions again */
            if (serve_fds(e, in->fd) != 0)
                break;
            continue;
        }
        if (passed >= 0 || h.type != TY__XFER_MSG_NOTIFY) {
            if (passed >= 0)
                close(passed);
            TY_LOG_WARN(TY_XFER_SUBSYS, "unexpected message on unix socket from '%s'",
                        in->peer_name);
            break;
        }
        struct ty__xfer_hdr ack = {.type = TY__XFER_MSG_ACK, .seq = h.seq};
        ack.status = ty__xfer_notify_push(e, in->peer_name, body, len);
        if (msg_send(in->fd, &ack, NULL, 0, -1) != 0)
            break;
    }
}

/* ---- client side -------------------------------------------------------------------------- */

struct map_list {
    size_t n;
    struct local_map *v; /* sorted by remote */
};

/* Insert keeping the list sorted. */
static void map_insert(struct map_list *l, struct local_map m)
{
    struct local_map *v = realloc(l->v, (l->n + 1) * sizeof(*v));
    if (!v)
        abort();
    l->v = v;
    size_t i = l->n;
    while (i > 0 && v[i - 1].remote > m.remote) {
        v[i] = v[i - 1];
        i--;
    }
    v[i] = m;
    l->n++;
}

/* Move the mapping of [addr, addr+len) from `old` to `next` when old has it (then marked taken
 * by ptr = NULL in old). */
static bool map_reuse(struct map_list *next, struct map_list *old, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < old->n; i++) {
        if (old->v[i].ptr && old->v[i].remote == addr && old->v[i].len == len) {
            map_insert(next, old->v[i]);
            old->v[i].ptr = NULL;
            return true;
        }
    }
    return false;
}

/* Add the region of one FDS message (fd >= 0) or CUDA_IPC message (handle and offset in body)
 * to `next`, reusing the mapping in `old` when it has the same range. */
static int map_add(struct map_list *next, struct map_list *old, const struct ty__xfer_hdr *h,
                   int fd, const uint8_t *body)
{
    uint64_t len = h->seq;
    if (len == 0 || h->addr + len < h->addr)
        return TY_EPROTO;
    if (map_reuse(next, old, h->addr, len))
        return 0;
    if (fd < 0) {
        /* the region's offset in its allocation */
        uint64_t off = ty__xfer_get_u64(body + TY__XFER_IPC_HANDLE);
#ifdef TY_XFER_HAVE_CUDA
        void *base;
        int rc = ty__xfer_cuda_ipc_open(body, &base);
        if (rc)
            return rc;
        map_insert(next, (struct local_map){h->addr, len, (uint8_t *)base + off, base});
        return 0;
#else
        (void)off;
        return TY_ENOTSUP; /* device memory of a peer, and no CUDA in this build */
#endif
    }
    /* No MAP_POPULATE: it would allocate and zero every page the peer has not touched yet (a
     * decode node's whole KV cache, gigabytes) in this open, which holds the engine's open lock
     * and outlasted a request's KV deadline on a loaded host. Pages are faulted in by the copies
     * that reach them; a page the peer already holds costs a minor fault once. */
    void *ptr = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ptr == MAP_FAILED)
        return ty_errno();
    map_insert(next, (struct local_map){h->addr, len, ptr, NULL});
    return 0;
}

static void map_drop(const struct local_map *m)
{
#ifdef TY_XFER_HAVE_CUDA
    if (m->ipc_base) {
        ty__xfer_cuda_ipc_close(m->ipc_base);
        return;
    }
#endif
    munmap(m->ptr, (size_t)m->len);
}

static void maps_unmap(struct map_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].ptr)
            map_drop(&l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

/* Receive FDS messages up to the closing ACK into *next. Mappings of `old` that reappear are
 * moved over; on error everything new is unmapped. */
static int maps_receive(struct local_peer *p, struct map_list *old, struct map_list *next)
{
    struct ty__xfer_hdr h;
    int rc = 0;
    while (rc == 0) {
        uint8_t body[TY__XFER_IPC_HANDLE + 8];
        size_t len;
        int fd;
        if ((rc = msg_recv(p->fd, &h, body, sizeof(body), &len, &fd)) != 0)
            break;
        if (h.type == TY__XFER_MSG_ACK) {
            if (h.addr == next->n)
                return 0;
            rc = TY_EPROTO;
            break;
        }
        if (h.type == TY__XFER_MSG_CUDA_IPC && fd < 0) {
            rc = map_add(next, old, &h, -1, body);
            continue;
        }
        if (h.type != TY__XFER_MSG_FDS || fd < 0 || len != 0) {
            if (fd >= 0)
                close(fd);
            rc = TY_EPROTO;
            break;
        }
        rc = map_add(next, old, &h, fd, NULL);
        close(fd);
    }
    /* give reused mappings back to old, unmap the new ones */
    for (size_t i = 0; i < next->n; i++)
        for (size_t k = 0; k < old->n; k++)
            if (!old->v[k].ptr && old->v[k].remote == next->v[i].remote) {
                old->v[k].ptr = next->v[i].ptr;
                next->v[i].ptr = NULL;
            }
    maps_unmap(next);
    return rc;
}

static int local_handshake(struct local_peer *p)
{
    ty_xfer_engine_t *e = p->e;
    struct ty__xfer_hdr h = {
        .type = TY__XFER_MSG_HELLO, .addr = TY__XFER_VERSION, .len = strlen(e->name)};
    int rc = msg_send(p->fd, &h, e->name, (size_t)h.len, -1);
    struct map_list none = {0}, next = {0};
    if (rc == 0 && (rc = maps_receive(p, &none, &next)) == 0) {
        p->maps = next.v;
        p->n = next.n;
    }
    return rc;
}

/* Ask the peer for its regions again and swap the mapping table. */
static int local_refresh(struct local_peer *p)
{
    pthread_mutex_lock(&p->mu);
    struct ty__xfer_hdr h = {.type = TY__XFER_MSG_FDS};
    int rc = msg_send(p->fd, &h, NULL, 0, -1);
    pthread_rwlock_wrlock(&p->maps_lock);
    struct map_list old = {p->n, p->maps}, next = {0};
    if (rc == 0 && (rc = maps_receive(p, &old, &next)) == 0) {
        maps_unmap(&old); /* what is left was released by the peer */
        p->maps = next.v;
        p->n = next.n;
    }
    pthread_rwlock_unlock(&p->maps_lock);
    pthread_mutex_unlock(&p->mu);
    if (rc)
        TY_LOG_WARN(TY_XFER_SUBSYS, "refreshing the regions of a local peer failed: %s",
                    ty_strerror(rc));
    return rc;
}

static void local_free(struct local_peer *p)
{
#ifdef TY_XFER_HAVE_CUDA
    ty__xfer_cuda_q_free(p->q); /* its copies land (and complete their tasks) first */
#endif
    for (size_t i = 0; i < p->n; i++)
        map_drop(&p->maps[i]);
    free(p->maps);
    if (p->fd >= 0)
        close(p->fd);
    pthread_rwlock_destroy(&p->maps_lock);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->qmu);
    free(p);
}

static struct local_peer *peer_alloc(ty_xfer_engine_t *e)
{
    struct local_peer *p = calloc(1, sizeof(*p));
    if (!p)
        abort();
    p->e = e;
    p->fd = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->qmu, NULL);
    pthread_rwlock_init(&p->maps_lock, NULL);
    return p;
}

int ty__xfer_local_open(ty_xfer_engine_t *e, const struct ty__xfer_hello *hello, void **ctx)
{
    struct local_peer *p = peer_alloc(e);
    int rc;
    p->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (p->fd < 0) {
        rc = ty_errno();
        goto err_free;
    }
    struct sockaddr_un sa;
    socklen_t sl = abstract_addr(&sa, hello->unix_name);
    if (connect(p->fd, (struct sockaddr *)&sa, sl) < 0) {
        rc = ty_errno();
        goto err_free;
    }
    if ((rc = ty__xfer_auth(e, p->fd, false, hello->unix_name)) != 0)
        goto err_free;
    ty__xfer_sock_timeouts(p->fd, e->timeout_ms);
    if ((rc = local_handshake(p)) != 0)
        goto err_free;
    *ctx = p;
    return 0;
err_free:
    local_free(p);
    return rc;
}

int ty__xfer_local_open_self(ty_xfer_engine_t *e, void **ctx)
{
    struct local_peer *p = peer_alloc(e);
    p->self = true;
    *ctx = p;
    return 0;
}

static const struct local_map *map_find(const struct local_peer *p, uint64_t addr, uint64_t len)
{
    size_t lo = 0, hi = p->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->maps[mid].remote <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0 || addr + len < addr)
        return NULL;
    const struct local_map *m = &p->maps[lo - 1];
    return addr + len <= m->remote + m->len ? m : NULL;
}

/* Copy r's bytes to or from `remote`: memcpy between host memory (done on return), else a
 * device copy queued on the peer's stream (*queued: the task completes at the flush). */
static int copy(struct local_peer *p, const struct ty__xfer_slice_req *r, uint8_t *remote,
                bool remote_dev, bool *queued)
{
    if (!remote_dev && !r->local_cuda) {
        if (r->op == TY_XFER_OP_WRITE)
            memcpy(remote, r->local, (size_t)r->len);
        else
            memcpy(r->local, remote, (size_t)r->len);
        return 0;
    }
#ifdef TY_XFER_HAVE_CUDA
    pthread_mutex_lock(&p->qmu);
    int rc = p->q ? 0 : ty__xfer_cuda_q_new(&p->q);
    pthread_mutex_unlock(&p->qmu);
    if (rc == 0 && r->op == TY_XFER_OP_WRITE)
        rc = ty__xfer_cuda_q_copy(p->q, remote, r->local, r->len, r->task);
    else if (rc == 0)
        rc = ty__xfer_cuda_q_copy(p->q, r->local, remote, r->len, r->task);
    *queued = rc == 0;
    return rc;
#else
    (void)p;
    return TY_ENOTSUP; /* unreachable: device memory needs a CUDA build */
#endif
}

static int copy_mapped(struct local_peer *p, const struct ty__xfer_slice_req *r, bool *queued)
{
    pthread_rwlock_rdlock(&p->maps_lock);
    const struct local_map *m = map_find(p, r->remote, r->len);
    int rc = m ? copy(p, r, m->ptr + (r->remote - m->remote), m->ipc_base != NULL, queued)
               : TY_EOUTOFRANGE;
    pthread_rwlock_unlock(&p->maps_lock);
    return rc;
}

static int local_submit(void *ctx, const struct ty__xfer_slice_req *r)
{
    struct local_peer *p = ctx;
    bool queued = false;
    int rc;
    if (p->self) {
        const struct ty__xfer_region *reg = ty__xfer_regions_rdlock(p->e, r->remote, r->len);
        if (!reg)
            return TY_EOUTOFRANGE;
        rc = copy(p, r, (uint8_t *)(uintptr_t)r->remote, reg->loc_kind == TY__XFER_LOC_CUDA,
                  &queued);
        ty__xfer_regions_unlock(p->e);
    } else {
        struct pollfd pfd = {.fd = p->fd, .events = POLLRDHUP};
        if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            return TY_ECONNRESET;
        rc = copy_mapped(p, r, &queued);
        if (rc == TY_EOUTOFRANGE && local_refresh(p) == 0)
            rc = copy_mapped(p, r, &queued); /* the peer may have registered it after our open */
    }
    if (rc)
        return rc;
    if (!queued) {
        ty__xfer_task_start(r->task, 1);
        ty__xfer_slice_done(r->task, r->len, 0);
    }
    return 0;
}

static void local_flush(void *ctx)
{
#ifdef TY_XFER_HAVE_CUDA
    struct local_peer *p = ctx;
    pthread_mutex_lock(&p->qmu);
    struct ty__xfer_cuda_q *q = p->q;
    pthread_mutex_unlock(&p->qmu);
    if (q)
        ty__xfer_cuda_q_flush(q);
#else
    (void)ctx;
#endif
}

static int local_notify(void *ctx, const void *msg, size_t len)
{
    struct local_peer *p = ctx;
    if (p->self)
        return ty__xfer_notify_push(p->e, p->e->name, msg, len);
    pthread_mutex_lock(&p->mu);
    struct ty__xfer_hdr h = {.type = TY__XFER_MSG_NOTIFY, .len = len};
    int rc = msg_send(p->fd, &h, msg, len, -1);
    if (rc == 0) {
        uint8_t body[8];
        size_t blen;
        int fd;
        rc = msg_recv(p->fd, &h, body, 0, &blen, &fd);
        if (rc == 0)
            rc = h.type == TY__XFER_MSG_ACK ? h.status : TY_EPROTO;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

static void local_close(void *ctx)
{
    local_free(ctx);
}

const struct ty__xfer_transport_i ty__xfer_local_iface = {
    .name = "local",
    .submit = local_submit,
    .notify = local_notify,
    .flush = local_flush,
    .tick = NULL,
    .close = local_close,
};

const struct ty__xfer_transport_i ty__xfer_local_ipc_iface = {
    .name = "cuda_ipc",
    .submit = local_submit,
    .notify = local_notify,
    .flush = local_flush,
    .tick = NULL,
    .close = local_close,
};
