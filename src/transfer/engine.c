/* The transfer engine object: options, start and stop, the notification queue (and the callback
 * that wakes its consumer) and the watchdog that enforces peer timeouts. The listener and
 * inbound connections are in inbound.c, segments and the region table in segment.c, batches in
 * batch.c. */
#include "xfer-impl.h"

#include "tycho/clock.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void read_host_id(char *out, size_t cap)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    out[0] = '\0';
    if (f) {
        if (fgets(out, (int)cap, f))
            out[strcspn(out, "\n")] = '\0';
        fclose(f);
    }
    if (!out[0]) {
        char h[64] = "unknown";
        gethostname(h, sizeof(h) - 1);
        snprintf(out, cap, "host-%s", h);
    }
}

static int copy_opt(char *dst, size_t cap, const char *src, const char *def)
{
    const char *s = src ? src : def;
    if (strlen(s) >= cap)
        return TY_EINVAL;
    strcpy(dst, s);
    return 0;
}

static int engine_set_opts(ty_xfer_engine_t *e, const struct ty_xfer_engine_opts *o)
{
    if (copy_opt(e->listen_host, sizeof(e->listen_host), o->listen_host, "127.0.0.1") ||
        copy_opt(e->transport, sizeof(e->transport), o->transport, "auto"))
        return TY_EINVAL;
    const char *adv = o->advertise_host ? o->advertise_host : e->listen_host;
    if (strcmp(adv, "0.0.0.0") == 0)
        adv = "127.0.0.1";
    if (copy_opt(e->advertise_host, sizeof(e->advertise_host), adv, adv))
        return TY_EINVAL;
    if (strcmp(e->transport, "auto") && strcmp(e->transport, "tcp") &&
        strcmp(e->transport, "local") && strcmp(e->transport, "rdma")) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "unknown transport '%s' (auto, tcp, local, rdma)",
                     e->transport);
        return TY_EINVAL;
    }
    e->tcp_conns = o->tcp_conns ? o->tcp_conns : 4;
    e->slice_bytes = o->slice_bytes ? o->slice_bytes : (1u << 20);
    e->tcp_window = o->tcp_window ? o->tcp_window : 2;
    e->timeout_ms = o->timeout_ms ? o->timeout_ms : 5000;
    e->auth = o->auth;
    e->max_inbound = o->max_inbound ? o->max_inbound : 1024;
    e->checksum = o->checksum;
    e->etcd_ttl_s = o->etcd_ttl_s ? o->etcd_ttl_s : 10;
    if (e->tcp_conns > 64 || e->slice_bytes < 4096 || e->slice_bytes > TY__XFER_MAX_SLICE ||
        e->tcp_window > 16) {
        TY_LOG_ERROR(TY_XFER_SUBSYS,
                     "tcp_conns must be 1..64, slice_bytes 4 KiB..256 MiB, tcp_window 1..16");
        return TY_EINVAL;
    }
    if (o->name && (!*o->name || strlen(o->name) > TY_XFER_NAME_MAX))
        return TY_EINVAL;
    return 0;
}

static void *watchdog_main(void *arg)
{
    ty_xfer_engine_t *e = arg;
    uint64_t period_ms = e->timeout_ms / 4;
    period_ms = period_ms < 10 ? 10 : period_ms > 250 ? 250 : period_ms;
    pthread_mutex_lock(&e->wd_mu);
    while (!atomic_load(&e->stopping)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + period_ms * TY_NS_PER_MS;
        ts.tv_sec += (time_t)(ns / TY_NS_PER_S);
        ts.tv_nsec = (long)(ns % TY_NS_PER_S);
        pthread_cond_timedwait(&e->wd_cv, &e->wd_mu, &ts);
        pthread_mutex_unlock(&e->wd_mu);
        uint64_t now = ty_clock_ns();
        pthread_mutex_lock(&e->seg_mu);
        for (struct ty_xfer_segment *s = e->segments; s; s = s->next)
            if (s->iface->tick)
                s->iface->tick(s->context, now);
        pthread_mutex_unlock(&e->seg_mu);
        pthread_mutex_lock(&e->wd_mu);
    }
    pthread_mutex_unlock(&e->wd_mu);
    return NULL;
}

/* Keep the etcd lease of our segment key alive; when it expired anyway (etcd unreachable longer
 * than the TTL), take a new lease and publish again. */
static void *etcd_keepalive_main(void *arg)
{
    ty_xfer_engine_t *e = arg;
    uint64_t period_ms = (uint64_t)e->etcd_ttl_s * 1000 / 3;
    pthread_mutex_lock(&e->wd_mu);
    while (!atomic_load(&e->stopping)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + period_ms * TY_NS_PER_MS;
        ts.tv_sec += (time_t)(ns / TY_NS_PER_S);
        ts.tv_nsec = (long)(ns % TY_NS_PER_S);
        pthread_cond_timedwait(&e->wd_cv, &e->wd_mu, &ts);
        if (atomic_load(&e->stopping))
            break;
        pthread_mutex_unlock(&e->wd_mu);
        int rc = ty__xfer_etcd_lease_keepalive(e->etcd);
        if (rc == TY_ELEASE) {
            TY_LOG_WARN(TY_XFER_SUBSYS, "etcd lease of '%s' expired: publishing again", e->name);
            if (ty__xfer_etcd_lease_grant(e->etcd, e->etcd_ttl_s) == 0)
                ty__xfer_engine_publish(e);
        } else if (rc) {
            TY_LOG_WARN(TY_XFER_SUBSYS, "etcd keepalive of '%s' failed: %s", e->name,
                        ty_strerror(rc));
        }
        pthread_mutex_lock(&e->wd_mu);
    }
    pthread_mutex_unlock(&e->wd_mu);
    return NULL;
}

static void engine_etcd_stop(ty_xfer_engine_t *e, bool delete_key);

static int engine_etcd_start(ty_xfer_engine_t *e, const char *endpoint)
{
    int rc = ty__xfer_etcd_new(&e->etcd, endpoint, e->timeout_ms);
    if (rc)
        return rc;
    if ((rc = ty__xfer_etcd_lease_grant(e->etcd, e->etcd_ttl_s)) != 0)
        return rc;
    if ((rc = ty__xfer_engine_publish(e)) != 0)
        return rc;
    if (pthread_create(&e->etcd_thr, NULL, etcd_keepalive_main, e) != 0)
        return TY_ENOMEM;
    e->etcd_thr_started = true;
    return 0;
}

static void engine_init_locks(ty_xfer_engine_t *e)
{
    /* writer preference: a stream of remote accesses must not starve unregister */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&e->regions_lock, &ra);
    pthread_rwlock_init(&e->fence_lock, &ra); /* revoking must not starve behind writes */
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&e->inbound_mu, NULL);
    pthread_mutex_init(&e->seg_mu, NULL);
    pthread_mutex_init(&e->open_mu, NULL);
    pthread_mutex_init(&e->notify_mu, NULL);
    pthread_mutex_init(&e->notify_cb_mu, NULL);
    pthread_mutex_init(&e->wd_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->wd_cv, &ca);
    pthread_condattr_destroy(&ca);
    e->listen_fd = e->unix_fd = -1;
}

static int engine_start(ty_xfer_engine_t *e, const struct ty_xfer_engine_opts *opts)
{
    int rc = ty__xfer_inbound_listen(e, opts->listen_port);
    if (rc)
        return rc;
    if (opts->name)
        strcpy(e->name, opts->name);
    else
        snprintf(e->name, sizeof(e->name), "%s:%u", e->advertise_host, e->port);
    if ((rc = ty__xfer_local_listen(e)) != 0)
        return rc;
    if (opts->etcd_endpoint && (rc = engine_etcd_start(e, opts->etcd_endpoint)) != 0)
        return rc;
    if (pthread_create(&e->listen_thr, NULL, ty__xfer_inbound_accept_main, e) != 0)
        return TY_ENOMEM;
    if (pthread_create(&e->wd_thr, NULL, watchdog_main, e) != 0) {
        atomic_store(&e->stopping, true);
        shutdown(e->listen_fd, SHUT_RDWR);
        pthread_join(e->listen_thr, NULL);
        return TY_ENOMEM;
    }
    return 0;
}

int ty_xfer_engine_new(ty_xfer_engine_t **out, const struct ty_xfer_engine_opts *opts)
{
    static const struct ty_xfer_engine_opts defaults = {0};
    if (!out)
        return TY_EINVAL;
    if (!opts)
        opts = &defaults;
    ty_xfer_engine_t *e = calloc(1, sizeof(*e));
    if (!e)
        abort();
    engine_init_locks(e);
    read_host_id(e->host_id, sizeof(e->host_id));
    int rc = engine_set_opts(e, opts);
    if (rc)
        goto err_free;
    if ((rc = ty__xfer_rdma_new(e, opts->rdma_devices, &e->rdma)) != 0)
        goto err_free;
    if (!e->rdma && strcmp(e->transport, "rdma") == 0) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "transport rdma: no usable RDMA device (%s%s)",
                     opts->rdma_devices ? "rdma_devices " : "none has an active port",
                     opts->rdma_devices ? opts->rdma_devices : "");
        rc = TY_ENODEV;
        goto err_free;
    }
    if (!e->rdma && strcmp(e->transport, "auto") == 0)
        TY_LOG_INFO(TY_XFER_SUBSYS, "transport auto: no RDMA device%s, so peers on this host "
                    "get local (shared memory) where their memory is shared, others tcp",
                    opts->rdma_devices && !strcmp(opts->rdma_devices, "none") ? " (none asked)"
                                                                              : "");
    if ((rc = engine_start(e, opts)) != 0)
        goto err_free;
    if (pthread_create(&e->unix_thr, NULL, ty__xfer_inbound_accept_unix_main, e) != 0) {
        rc = TY_ENOMEM;
        goto err_stop;
    }
    TY_LOG_INFO(TY_XFER_SUBSYS, "engine '%s' listening on %s:%u (transport %s, %u conns/peer)",
                e->name, e->listen_host, e->port, e->transport, e->tcp_conns);
    *out = e;
    return 0;
err_stop:
    atomic_store(&e->stopping, true);
    shutdown(e->listen_fd, SHUT_RDWR);
    pthread_join(e->listen_thr, NULL);
    pthread_mutex_lock(&e->wd_mu);
    pthread_cond_broadcast(&e->wd_cv);
    pthread_mutex_unlock(&e->wd_mu);
    pthread_join(e->wd_thr, NULL);
err_free:
    engine_etcd_stop(e, false);
    ty__xfer_rdma_free(e->rdma);
    if (e->listen_fd >= 0)
        close(e->listen_fd);
    if (e->unix_fd >= 0)
        close(e->unix_fd);
    free(e);
    return rc;
}

/* Stop the keepalive thread (stopping is set and wd_cv broadcast already), remove our key and
 * revoke the lease. */
static void engine_etcd_stop(ty_xfer_engine_t *e, bool delete_key)
{
    if (!e->etcd)
        return;
    if (e->etcd_thr_started) {
        atomic_store(&e->stopping, true);
        pthread_mutex_lock(&e->wd_mu);
        pthread_cond_broadcast(&e->wd_cv);
        pthread_mutex_unlock(&e->wd_mu);
        pthread_join(e->etcd_thr, NULL);
    }
    if (delete_key) {
        char key[TY_XFER_NAME_MAX + 64];
        snprintf(key, sizeof(key), "/tycho/xfer/segments/%s", e->name);
        ty__xfer_etcd_del(e->etcd, key);
    }
    ty__xfer_etcd_lease_revoke(e->etcd);
    ty__xfer_etcd_free(e->etcd);
    e->etcd = NULL;
}

static void engine_free_regions(ty_xfer_engine_t *e)
{
    for (size_t i = 0; i < e->regions.n; i++) {
        struct ty__xfer_region *r = &e->regions.v[i];
        ty__xfer_rdma_dereg(r);
        if (r->owned)
            munmap((void *)(uintptr_t)r->addr, r->len);
        if (r->memfd >= 0)
            close(r->memfd);
    }
    ty__xfer_regions_clear(&e->regions);
}

void ty_xfer_engine_free(ty_xfer_engine_t *e)
{
    if (!e)
        return;
    atomic_store(&e->stopping, true);
    pthread_mutex_lock(&e->wd_mu);
    pthread_cond_broadcast(&e->wd_cv);
    pthread_mutex_unlock(&e->wd_mu);
    pthread_join(e->wd_thr, NULL);
    while (e->segments) {
        struct ty_xfer_segment *s = e->segments;
        s->opens = 1;
        ty_xfer_segment_close(e, s);
    }
    shutdown(e->listen_fd, SHUT_RDWR);
    shutdown(e->unix_fd, SHUT_RDWR);
    pthread_join(e->listen_thr, NULL);
    pthread_join(e->unix_thr, NULL);
    close(e->listen_fd);
    close(e->unix_fd);
    ty__xfer_inbound_reap(e, true);
    engine_etcd_stop(e, true);
    engine_free_regions(e);
    ty__xfer_rdma_free(e->rdma); /* after every QP (segments, inbound) and MR is gone */
    while (e->notify_head) {
        struct ty__xfer_notify_node *n = e->notify_head;
        e->notify_head = n->next;
        free(n);
    }
    pthread_rwlock_destroy(&e->regions_lock);
    pthread_rwlock_destroy(&e->fence_lock);
    free(e);
}

const char *ty_xfer_engine_name(const ty_xfer_engine_t *e)
{
    return e->name;
}

uint16_t ty_xfer_engine_port(const ty_xfer_engine_t *e)
{
    return e->port;
}

/* ---- notifications ------------------------------------------------------------------------ */

int ty__xfer_notify_push(ty_xfer_engine_t *e, const char *from, const void *msg, size_t len)
{
    if (len > TY_XFER_NOTIFY_MAX)
        return TY_EMSGSIZE;
    struct ty__xfer_notify_node *n = calloc(1, sizeof(*n));
    if (!n)
        abort();
    snprintf(n->n.from, sizeof(n->n.from), "%s", from);
    n->n.len = (uint32_t)len;
    memcpy(n->n.msg, msg, len);
    pthread_mutex_lock(&e->notify_mu);
    if (e->notify_len >= 65536) {
        pthread_mutex_unlock(&e->notify_mu);
        free(n);
        return TY_ENOSPC;
    }
    if (e->notify_tail)
        e->notify_tail->next = n;
    else
        e->notify_head = n;
    e->notify_tail = n;
    e->notify_len++;
    pthread_mutex_unlock(&e->notify_mu);
    pthread_mutex_lock(&e->notify_cb_mu); /* queued first: the woken consumer finds it */
    if (e->notify_cb)
        e->notify_cb(e->notify_arg);
    pthread_mutex_unlock(&e->notify_cb_mu);
    return 0;
}

void ty_xfer_notify_set_cb(ty_xfer_engine_t *e, ty_xfer_notify_cb cb, void *arg)
{
    pthread_mutex_lock(&e->notify_cb_mu);
    e->notify_cb = cb;
    e->notify_arg = arg;
    pthread_mutex_unlock(&e->notify_cb_mu);
}

int ty_xfer_notify_poll(ty_xfer_engine_t *e, struct ty_xfer_notify *out)
{
    pthread_mutex_lock(&e->notify_mu);
    struct ty__xfer_notify_node *n = e->notify_head;
    if (n) {
        e->notify_head = n->next;
        if (!e->notify_head)
            e->notify_tail = NULL;
        e->notify_len--;
    }
    pthread_mutex_unlock(&e->notify_mu);
    if (!n)
        return TY_EAGAIN;
    *out = n->n;
    free(n);
    return 0;
}

/* ---- stats -------------------------------------------------------------------------------- */

void ty_xfer_engine_stats(ty_xfer_engine_t *e, struct ty_xfer_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->bytes_written = atomic_load(&e->st.bytes_written);
    out->bytes_read = atomic_load(&e->st.bytes_read);
    out->tasks_done = atomic_load(&e->st.tasks_done);
    out->tasks_failed = atomic_load(&e->st.tasks_failed);
    out->served_bytes_in = atomic_load_explicit(&e->st.served_in, memory_order_acquire);
    out->served_bytes_out = atomic_load(&e->st.served_out);
    out->refused_accesses = atomic_load(&e->st.refused);
    out->checksum_errors = atomic_load(&e->st.checksum_errors);
    out->peer_failures = atomic_load(&e->st.peer_failures);
    out->reconnects = atomic_load(&e->st.reconnects);
    out->auth_failures = atomic_load(&e->st.auth_failures);
    out->refused_conns = atomic_load(&e->st.refused_conns);
    out->fenced_writes = atomic_load(&e->st.fenced_writes);
    pthread_mutex_lock(&e->seg_mu);
    for (struct ty_xfer_segment *s = e->segments; s; s = s->next) {
        if (s->iface == &ty__xfer_tcp_iface)
            out->segments_tcp++;
        else if (s->iface == &ty__xfer_local_iface || s->iface == &ty__xfer_local_ipc_iface)
            out->segments_local++;
        else
            out->segments_rdma++;
    }
    pthread_mutex_unlock(&e->seg_mu);
}

void ty_xfer_engine_set_write_fence(ty_xfer_engine_t *e, ty_xfer_write_fence_cb cb, void *arg)
{
    pthread_rwlock_wrlock(&e->fence_lock);
    e->fence_cb = cb;
    e->fence_arg = arg;
    pthread_rwlock_unlock(&e->fence_lock);
}

void ty_xfer_engine_fence_revoke(ty_xfer_engine_t *e, uint32_t tag)
{
    if (!tag)
        return;
    /* a write approved just now has set its writing_tag before the fence lock went */
    pthread_rwlock_wrlock(&e->fence_lock);
    pthread_rwlock_unlock(&e->fence_lock);
    uint64_t t0 = ty_clock_ns();
    bool shut = false;
    for (;;) {
        bool busy = false;
        pthread_mutex_lock(&e->inbound_mu);
        for (struct ty__xfer_inbound *in = e->inbound; in; in = in->next) {
            if (atomic_load(&in->writing_tag) != tag)
                continue;
            busy = true;
            if (shut)
                shutdown(in->fd, SHUT_RDWR);
        }
        pthread_mutex_unlock(&e->inbound_mu);
        if (!busy)
            return;
        if (!shut && ty_clock_ns() - t0 > 100 * TY_NS_PER_MS) {
            shut = true;
            atomic_fetch_add(&e->st.fenced_writes, 1);
            TY_LOG_WARN(TY_XFER_SUBSYS, "a write tagged %08x is still landing 100 ms after its "
                        "fence was revoked: shutting its connection", tag);
            continue;
        }
        ty_sleep_ns(200 * 1000);
    }
}
