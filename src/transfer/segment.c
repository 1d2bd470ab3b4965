/* Registered memory and remote segments: the region table of this engine, segment open/close,
 * and the choice of transport for a peer (logged once per open, never changed afterwards). */
#include "xfer-impl.h"

#include "tycho/config.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- memory ------------------------------------------------------------------------------- */

void ty__xfer_engine_hello(ty_xfer_engine_t *e, struct ty__xfer_hello *h)
{
    memset(h, 0, sizeof(*h));
    snprintf(h->name, sizeof(h->name), "%s", e->name);
    snprintf(h->host_id, sizeof(h->host_id), "%s", e->host_id);
    snprintf(h->unix_name, sizeof(h->unix_name), "%s", e->unix_name);
    pthread_rwlock_rdlock(&e->regions_lock);
    h->n_regions = e->regions.n;
    h->regions = calloc(h->n_regions ? h->n_regions : 1, sizeof(*h->regions));
    if (!h->regions)
        abort();
    for (size_t i = 0; i < e->regions.n; i++) {
        const struct ty__xfer_region *r = &e->regions.v[i];
        h->regions[i].addr = r->addr;
        h->regions[i].len = r->len;
        h->regions[i].shared = r->memfd >= 0 || r->ipc;
        h->regions[i].cuda_ipc = r->ipc;
        snprintf(h->regions[i].location, sizeof(h->regions[i].location), "%s:%d",
                 r->loc_kind == TY__XFER_LOC_CUDA ? "cuda" : "cpu", r->loc_dev);
    }
    ty__xfer_rdma_describe(e->rdma, h);
    if (h->n_nics) { /* rkeys[region][nic] */
        h->rkeys = calloc(h->n_regions * h->n_nics, sizeof(*h->rkeys));
        if (!h->rkeys)
            abort();
        for (size_t i = 0; i < e->regions.n; i++)
            memcpy(&h->rkeys[i * h->n_nics], e->regions.v[i].rkey, h->n_nics * sizeof(uint32_t));
    }
    pthread_rwlock_unlock(&e->regions_lock);
}

int ty__xfer_engine_publish(ty_xfer_engine_t *e)
{
    if (!e->etcd)
        return 0;
    struct ty__xfer_hello h;
    ty__xfer_engine_hello(e, &h);
    char *json = ty__xfer_meta_to_json(&h, e->advertise_host, e->port);
    ty__xfer_hello_clear(&h);
    char key[TY_XFER_NAME_MAX + 64];
    snprintf(key, sizeof(key), "/tycho/xfer/segments/%s", e->name);
    int rc = ty__xfer_etcd_put(e->etcd, key, json);
    free(json);
    if (rc)
        TY_LOG_ERROR(TY_XFER_SUBSYS, "publishing segment '%s' to etcd failed: %s", e->name,
                     ty_strerror(rc));
    return rc;
}

static int mem_add(ty_xfer_engine_t *e, void *addr, size_t len, const char *location, int memfd,
                   bool owned)
{
    struct ty__xfer_region r = {
        .addr = (uintptr_t)addr, .len = len, .memfd = memfd, .owned = owned};
    if (!addr || ty__xfer_location_parse(location, &r.loc_kind, &r.loc_dev) != 0)
        return TY_EINVAL;
#ifndef TY_XFER_HAVE_CUDA
    if (r.loc_kind == TY__XFER_LOC_CUDA) {
        TY_LOG_ERROR(TY_XFER_SUBSYS, "location '%s': this build has no CUDA", location);
        return TY_ENOTSUP;
    }
#else
    /* same-host peers reach it by CUDA IPC where the driver exports it; else only over tcp */
    if (r.loc_kind == TY__XFER_LOC_CUDA)
        r.ipc = ty__xfer_cuda_ipc_export(addr, len, r.ipc_handle, &r.ipc_offset) == 0;
#endif
    int rc = ty__xfer_rdma_reg(e->rdma, &r); /* pins the pages on every NIC */
    if (rc)
        return rc;
    pthread_rwlock_wrlock(&e->regions_lock);
    rc = ty__xfer_regions_add(&e->regions, &r);
    pthread_rwlock_unlock(&e->regions_lock);
    if (rc == 0)
        ty__xfer_engine_publish(e);
    else
        ty__xfer_rdma_dereg(&r);
    return rc;
}

int ty_xfer_mem_register(ty_xfer_engine_t *e, void *addr, size_t len, const char *location)
{
    return mem_add(e, addr, len, location, -1, false);
}

static int mem_remove(ty_xfer_engine_t *e, void *addr, bool want_owned)
{
    struct ty__xfer_region r;
    pthread_rwlock_wrlock(&e->regions_lock);
    const struct ty__xfer_region *f = ty__xfer_regions_find(&e->regions, (uintptr_t)addr, 1);
    int rc = TY_ENOTFOUND;
    if (f && f->addr == (uintptr_t)addr && f->owned == want_owned)
        rc = ty__xfer_regions_remove(&e->regions, (uintptr_t)addr, &r);
    pthread_rwlock_unlock(&e->regions_lock);
    if (rc)
        return rc;
    ty__xfer_rdma_dereg(&r); /* peers' RDMA access to it fails from here on */
    if (r.owned)
        munmap(addr, r.len);
    if (r.memfd >= 0)
        close(r.memfd);
    ty__xfer_engine_publish(e);
    return 0;
}

int ty_xfer_mem_unregister(ty_xfer_engine_t *e, void *addr)
{
    return mem_remove(e, addr, false);
}

int ty_xfer_mem_alloc(ty_xfer_engine_t *e, size_t len, void **out)
{
    int fd;
    void *p;
    if (len == 0 || !out)
        return TY_EINVAL;
    int rc = ty__xfer_memfd_alloc(len, &fd, &p);
    if (rc)
        return rc;
    if (len >= (64u << 20)) /* large enough for the pages to matter: say which it got */
        TY_LOG_INFO(TY_XFER_SUBSYS, "%.1f MiB region on %s", (double)len / (1 << 20),
                    ty__xfer_shmem_thp() ? "transparent huge pages"
                         : "4 KiB pages (tmpfs huge pages are off: "
                           "/sys/kernel/mm/transparent_hugepage/shmem_enabled)");
    if ((rc = mem_add(e, p, len, "cpu:0", fd, true)) != 0) {
        munmap(p, len);
        close(fd);
        return rc;
    }
    *out = p;
    return 0;
}

int ty_xfer_mem_release(ty_xfer_engine_t *e, void *addr)
{
    return mem_remove(e, addr, true);
}

const struct ty__xfer_region *ty__xfer_regions_rdlock(ty_xfer_engine_t *e, uint64_t addr,
                                                      uint64_t len)
{
    pthread_rwlock_rdlock(&e->regions_lock);
    const struct ty__xfer_region *r = ty__xfer_regions_find(&e->regions, addr, len);
    if (!r)
        pthread_rwlock_unlock(&e->regions_lock);
    return r;
}

void ty__xfer_regions_unlock(ty_xfer_engine_t *e)
{
    pthread_rwlock_unlock(&e->regions_lock);
}

/* ---- segments ----------------------------------------------------------------------------- */

static struct ty_xfer_segment *seg_find(ty_xfer_engine_t *e, const char *name)
{
    for (struct ty_xfer_segment *s = e->segments; s; s = s->next)
        if (strcmp(s->name, name) == 0)
            return s;
    return NULL;
}

/* Where the peer lives and, in etcd mode, its regions. */
static int seg_resolve(ty_xfer_engine_t *e, const char *name, char *host, size_t cap,
                       uint16_t *port, struct ty__xfer_hello *meta)
{
    memset(meta, 0, sizeof(*meta));
    if (!e->etcd) {
        int rc = ty_config_split_hostport(name, host, cap, port);
        if (rc)
            TY_LOG_ERROR(TY_XFER_SUBSYS, "segment '%s': expected host:port (no etcd set)", name);
        return rc;
    }
    char key[TY_XFER_NAME_MAX + 64], *json;
    snprintf(key, sizeof(key), "/tycho/xfer/segments/%s", name);
    int rc = ty__xfer_etcd_get(e->etcd, key, &json);
    if (rc)
        return rc;
    rc = ty__xfer_meta_from_json(json, meta, host, cap, port);
    free(json);
    if (rc)
        TY_LOG_ERROR(TY_XFER_SUBSYS, "segment '%s': malformed metadata in etcd", name);
    return rc;
}

/* Whether the local transport reaches every region of the peer: memfd host memory, and device
 * memory by CUDA IPC where this process has a device to open it with. */
static bool all_shared(const struct ty__xfer_hello *h)
{
    for (size_t i = 0; i < h->n_regions; i++)
        if (!h->regions[i].shared || (h->regions[i].cuda_ipc && !ty__xfer_cuda_ipc_usable()))
            return false;
    return h->n_regions > 0;
}

static bool any_ipc(const struct ty__xfer_hello *h)
{
    for (size_t i = 0; i < h->n_regions; i++)
        if (h->regions[i].cuda_ipc)
            return true;
    return false;
}

/* Replace the tcp peer state in *ctx with the RDMA transport. Returns 0 or an error (tcp kept). */
static int seg_use_rdma(ty_xfer_engine_t *e, const char *name, const char *host, uint16_t port,
                        const struct ty__xfer_hello *h, void **ctx,
                        const struct ty__xfer_transport_i **iface)
{
    void *rctx;
    int rc = ty__xfer_rdma_open(e, host, port, h, &rctx);
    if (rc)
        return rc;
    ty__xfer_tcp_iface.close(*ctx);
    *ctx = rctx;
    *iface = &ty__xfer_rdma_iface;
    TY_LOG_INFO(TY_XFER_SUBSYS, "segment '%s' served by rdma", name);
    return 0;
}

static int seg_use_local(ty_xfer_engine_t *e, const char *name, const struct ty__xfer_hello *h,
                         void **ctx, const struct ty__xfer_transport_i **iface)
{
    void *lctx;
    int rc = ty__xfer_local_open(e, h, &lctx);
    if (rc)
        return rc;
    ty__xfer_tcp_iface.close(*ctx);
    *ctx = lctx;
    bool ipc = any_ipc(h);
    *iface = ipc ? &ty__xfer_local_ipc_iface : &ty__xfer_local_iface;
    TY_LOG_INFO(TY_XFER_SUBSYS, "segment '%s' served by local (%s)", name,
                ipc ? "CUDA IPC" : "shared memory");
    return 0;
}

/* Pick and open the transport for a connected tcp peer. On return iface and ctx serve it.
 * auto: local for a same-host peer whose regions are all shared (memfd host memory, or device
 * memory this process can open by CUDA IPC), else rdma when both
 * sides have NICs that pair, else tcp; every fallback is logged as a warning. */
static int seg_choose(ty_xfer_engine_t *e, const char *name, const char *host, uint16_t port,
                      const struct ty__xfer_hello *h, void **ctx,
                      const struct ty__xfer_transport_i **iface)
{
    bool same_host = strcmp(h->host_id, e->host_id) == 0 && h->unix_name[0];
    bool is_auto = strcmp(e->transport, "auto") == 0;
    int rc;
    *iface = &ty__xfer_tcp_iface;
    if (strcmp(e->transport, "local") == 0) {
        if (!same_host || !all_shared(h)) {
            TY_LOG_ERROR(TY_XFER_SUBSYS,
                         "segment '%s': local transport needs a same-host peer "
                         "whose regions are all shared memory or CUDA IPC memory "
                         "(and a CUDA device here for the latter)",
                         name);
            return TY_ENOTSUP;
        }
        return seg_use_local(e, name, h, ctx, iface);
    }
    if (strcmp(e->transport, "rdma") == 0) {
        if (!ty__xfer_rdma_can_serve(e, h)) {
            TY_LOG_ERROR(TY_XFER_SUBSYS,
                         "segment '%s': rdma needs active NICs on both sides "
                         "(here %zu, peer %zu) with a common link layer",
                         name, ty__xfer_rdma_nic_count(e->rdma), h->n_nics);
            return TY_ENOTSUP;
        }
        return seg_use_rdma(e, name, host, port, h, ctx, iface);
    }
    if (is_auto && same_host && all_shared(h)) {
        if ((rc = seg_use_local(e, name, h, ctx, iface)) == 0)
            return 0;
        TY_LOG_WARN(TY_XFER_SUBSYS, "segment '%s': %s unavailable (%s), using tcp", name,
                    any_ipc(h) ? "CUDA IPC" : "shared memory", ty_strerror(rc));
    } else if (is_auto && ty__xfer_rdma_can_serve(e, h)) {
        if ((rc = seg_use_rdma(e, name, host, port, h, ctx, iface)) == 0)
            return 0;
        TY_LOG_WARN(TY_XFER_SUBSYS, "segment '%s': rdma unavailable (%s), using tcp", name,
                    ty_strerror(rc));
    }
    TY_LOG_INFO(TY_XFER_SUBSYS, "segment '%s' served by tcp (%s)", name,
                same_host ? "same host" : "remote host");
    return 0;
}

static int seg_connect(ty_xfer_engine_t *e, const char *name, struct ty_xfer_segment *s)
{
    if (strcmp(e->transport, "rdma") == 0 && !e->rdma) {
        TY_LOG_ERROR(TY_XFER_SUBSYS,
                     "segment '%s': rdma transport requested but this engine "
                     "has no active RDMA NIC",
                     name);
        return TY_ENOTSUP;
    }
    if (strcmp(name, e->name) == 0) {
        s->iface = &ty__xfer_local_iface;
        TY_LOG_INFO(TY_XFER_SUBSYS, "segment '%s' served by local (same process)", name);
        return ty__xfer_local_open_self(e, &s->context);
    }
    char host[128];
    uint16_t port;
    struct ty__xfer_hello meta, hello;
    int rc = seg_resolve(e, name, host, sizeof(host), &port, &meta);
    if (rc)
        return rc;
    if ((rc = ty__xfer_tcp_open(e, host, port, &hello, &s->context)) != 0)
        goto out_meta;
    if (e->etcd) { /* etcd is the source of region metadata in this mode */
        ty__xfer_hello_clear(&hello);
        hello.regions = meta.regions;
        hello.n_regions = meta.n_regions;
        hello.rkeys = meta.rkeys;
        hello.n_nics = meta.n_nics;
        memcpy(hello.nics, meta.nics, sizeof(hello.nics));
        meta.regions = NULL;
        meta.rkeys = NULL;
    }
    if ((rc = seg_choose(e, name, host, port, &hello, &s->context, &s->iface)) != 0) {
        ty__xfer_tcp_iface.close(s->context);
        ty__xfer_hello_clear(&hello);
        goto out_meta;
    }
    s->regions = hello.regions;
    s->n_regions = hello.n_regions;
out_meta:
    ty__xfer_hello_clear(&meta);
    return rc;
}

int ty_xfer_segment_open(ty_xfer_engine_t *e, const char *name, ty_xfer_segment_t **out)
{
    if (!e || !name || !*name || strlen(name) > TY_XFER_NAME_MAX || !out)
        return TY_EINVAL;
    pthread_mutex_lock(&e->open_mu);
    pthread_mutex_lock(&e->seg_mu);
    struct ty_xfer_segment *s = seg_find(e, name);
    if (s)
        s->opens++;
    pthread_mutex_unlock(&e->seg_mu);
    int rc = 0;
    if (!s) {
        s = calloc(1, sizeof(*s));
        if (!s)
            abort();
        snprintf(s->name, sizeof(s->name), "%s", name);
        pthread_mutex_init(&s->mu, NULL);
        s->opens = 1;
        if ((rc = seg_connect(e, name, s)) != 0) {
            free(s);
            s = NULL;
        } else {
            pthread_mutex_lock(&e->seg_mu);
            s->next = e->segments;
            e->segments = s;
            pthread_mutex_unlock(&e->seg_mu);
        }
    }
    pthread_mutex_unlock(&e->open_mu);
    *out = s;
    return rc;
}

int ty_xfer_segment_close(ty_xfer_engine_t *e, ty_xfer_segment_t *seg)
{
    pthread_mutex_lock(&e->seg_mu);
    if (--seg->opens > 0) {
        pthread_mutex_unlock(&e->seg_mu);
        return 0;
    }
    for (struct ty_xfer_segment **pp = &e->segments; *pp; pp = &(*pp)->next) {
        if (*pp == seg) {
            *pp = seg->next;
            break;
        }
    }
    pthread_mutex_unlock(&e->seg_mu);
    seg->iface->close(seg->context);
    free(seg->regions);
    pthread_mutex_destroy(&seg->mu);
    free(seg);
    return 0;
}

const char *ty_xfer_segment_transport(const ty_xfer_segment_t *seg)
{
    return seg->iface->name;
}

int ty_xfer_segment_regions(ty_xfer_segment_t *seg, struct ty_xfer_region_info *out, size_t cap,
                            size_t *n)
{
    pthread_mutex_lock(&seg->mu);
    for (size_t i = 0; i < seg->n_regions && i < cap; i++)
        out[i] = seg->regions[i];
    if (n)
        *n = seg->n_regions;
    pthread_mutex_unlock(&seg->mu);
    return 0;
}

int ty_xfer_notify_send(ty_xfer_engine_t *e, ty_xfer_segment_t *seg, const void *msg, size_t len)
{
    if (!seg || (!msg && len))
        return TY_EINVAL;
    if (len > TY_XFER_NOTIFY_MAX)
        return TY_EMSGSIZE;
    return seg->iface->notify(seg->context, msg, len);
}
