/* SSD tier: append-only bucket files through io_uring, checksummed reads, rescan on open
 * (store_ssd.h). Record: struct rec_hdr | key | bytes | zero padding to SSD_ALIGN. */
#include "tycho/store_ssd.h"

#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/store_meta.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define SSD_ALIGN 4096u
#define REC_MAGIC 0x564b5954u /* "TYKV" */
#define IDX_MAGIC 0x58495954u /* "TYIX" */
#define LOC_SHIFT 40          /* loc = bucket id << 40 | offset in the bucket */

#define BUCKET_ID_MAX ((1u << (64 - LOC_SHIFT)) - 1) /* ids that fit a location */

struct rec_hdr {
    uint32_t magic;
    uint16_t version;
    uint16_t key_len;
    uint64_t data_len;
    uint64_t checksum;  /* XXH3-64 of the bytes */
    uint64_t hdr_check; /* XXH3-64 of the 24 bytes above and the key */
};

struct ent {
    char *key;
    uint64_t hash;
    uint32_t bucket;
    uint64_t off, data_len, checksum;
    struct ent *next;
};

struct bucket {
    uint32_t id;
    int fd;
    uint64_t size;
    bool sealed;
};

struct ty_store_ssd {
    pthread_mutex_t mu;
    char *dir;
    uint64_t capacity, bucket_bytes, total;
    bool direct;
    bool ring_broken; /* a submit or wait failed for good: every I/O fails with TY_EIO */
    uint64_t io_seq;  /* tag of the last request (user_data) */
    struct io_uring ring;
    struct bucket *b; /* oldest first; the last one is open for appends unless sealed */
    size_t nb, capb;
    uint32_t next_id;
    struct ent **map;
    size_t n_map, n_ents;
    char (*dropped)[256];
    size_t n_dropped, cap_dropped;
    struct ty_store_ssd_stats st;
};

static uint64_t rec_size(uint64_t key_len, uint64_t data_len)
{
    uint64_t n = sizeof(struct rec_hdr) + key_len + data_len;
    return (n + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
}

static uint64_t hdr_check(const struct rec_hdr *h, const char *key)
{
    uint8_t buf[offsetof(struct rec_hdr, hdr_check) + TY_STORE_KEY_MAX];
    memcpy(buf, h, offsetof(struct rec_hdr, hdr_check));
    memcpy(buf + offsetof(struct rec_hdr, hdr_check), key, h->key_len);
    return XXH3_64bits(buf, offsetof(struct rec_hdr, hdr_check) + h->key_len);
}

/* ---- key map ------------------------------------------------------------------------------- */

static struct ent **map_slot(const ty_store_ssd_t *s, const char *key, uint64_t *hash)
{
    *hash = XXH3_64bits(key, strlen(key));
    struct ent **pp = &s->map[*hash & (s->n_map - 1)];
    while (*pp && !((*pp)->hash == *hash && strcmp((*pp)->key, key) == 0))
        pp = &(*pp)->next;
    return pp;
}

static void map_grow(ty_store_ssd_t *s)
{
    size_t nn = s->n_map * 2;
    struct ent **nm = calloc(nn, sizeof(*nm));
    TY_ASSERT(nm != NULL);
    for (size_t i = 0; i < s->n_map; i++)
        for (struct ent *e = s->map[i], *next; e; e = next) {
            next = e->next;
            e->next = nm[e->hash & (nn - 1)];
            nm[e->hash & (nn - 1)] = e;
        }
    free(s->map);
    s->map = nm;
    s->n_map = nn;
}

static void ent_add(ty_store_ssd_t *s, const char *key, uint32_t bucket, uint64_t off, uint64_t len,
                    uint64_t checksum)
{
    if (s->n_ents + 1 > s->n_map)
        map_grow(s);
    uint64_t h;
    struct ent **pp = map_slot(s, key, &h);
    if (*pp) {
        /* The newest copy wins: buckets are read oldest first and a put refuses a key held, so a
         * later copy was put after the earlier one was removed or dropped (a bad checksum). The
         * first copy winning made a restart bring back the dropped block over the good one. */
        struct ent *e = *pp;
        s->st.bytes_used = s->st.bytes_used - e->data_len + len;
        e->bucket = bucket;
        e->off = off;
        e->data_len = len;
        e->checksum = checksum;
        return;
    }
    struct ent *e = calloc(1, sizeof(*e));
    TY_ASSERT(e != NULL);
    e->key = strdup(key);
    TY_ASSERT(e->key != NULL);
    *e = (struct ent){.key = e->key,
                      .hash = h,
                      .bucket = bucket,
                      .off = off,
                      .data_len = len,
                      .checksum = checksum};
    *pp = e;
    s->n_ents++;
    s->st.bytes_used += len;
}

static void note_dropped(ty_store_ssd_t *s, const char *key)
{
    if (s->n_dropped == s->cap_dropped) {
        s->cap_dropped = s->cap_dropped ? s->cap_dropped * 2 : 64;
        s->dropped = realloc(s->dropped, s->cap_dropped * sizeof(*s->dropped));
        TY_ASSERT(s->dropped != NULL);
    }
    snprintf(s->dropped[s->n_dropped++], 256, "%s", key);
}

/* Unlink *pp and free it. */
static void ent_del(ty_store_ssd_t *s, struct ent **pp, bool report)
{
    struct ent *e = *pp;
    *pp = e->next;
    if (report)
        note_dropped(s, e->key);
    s->n_ents--;
    s->st.bytes_used -= e->data_len;
    free(e->key);
    free(e);
}

/* ---- I/O ------------------------------------------------------------------------------------ */

/* Wait for the completion of request `tag`. A signal (EINTR) never ends the wait: the request
 * is still in flight and owns the buffer, and its completion must not be taken for the next
 * request's (the fuzzer's SIGALRM made a put return 0 while its write was still pending, and the
 * following get read the put's completion instead of its own: issue #8). */
static int io_wait(ty_store_ssd_t *s, uint64_t tag)
{
    for (;;) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&s->ring, &cqe);
        if (rc == TY_EINTR || rc == TY_EAGAIN || rc == -ETIME)
            continue;
        if (rc < 0) {
            s->ring_broken = true; /* our ring is unusable: no further I/O goes through it */
            TY_LOG_ERROR("store", "%s: io_uring wait failed: %s", s->dir, ty_strerror(rc));
            return TY_EIO;
        }
        uint64_t got = io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&s->ring, cqe);
        if (got == tag)
            return res;
        /* a completion that is not ours: nothing else is ever in flight, so ignore it */
    }
}

/* Submit one read or write and wait for it. Returns bytes moved (> 0, maybe fewer than len) or
 * a negative code. */
static int io_once(ty_store_ssd_t *s, bool write, int fd, void *buf, size_t len, uint64_t off)
{
    if (s->ring_broken)
        return TY_EIO;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    if (!sqe)
        return TY_EAGAIN;
    if (write)
        io_uring_prep_write(sqe, fd, buf, (unsigned)len, off);
    else
        io_uring_prep_read(sqe, fd, buf, (unsigned)len, off);
    uint64_t tag = ++s->io_seq;
    io_uring_sqe_set_data64(sqe, tag);
    int rc;
    for (int tries = 0; (rc = io_uring_submit(&s->ring)) != 1; tries++) {
        if (rc < 0 && rc != TY_EINTR && rc != TY_EAGAIN && rc != TY_EBUSY)
            break;
        if (tries == 1000)
            break;
        if (rc != TY_EINTR)
            usleep(100);
    }
    if (rc != 1) {
        /* The request stays queued in the ring and would go out with the next submit, after
         * its buffer is freed: never submit through this ring again. */
        s->ring_broken = true;
        TY_LOG_ERROR("store", "%s: io_uring submit failed: %s", s->dir,
                     ty_strerror(rc < 0 ? rc : TY_EIO));
        return TY_EIO;
    }
    return io_wait(s, tag);
}

/* Move exactly len bytes (<= one I/O's limit): short transfers continue, an interrupted request
 * is issued again, end of file is TY_EIO. ECANCELED (the kernel gave up on a request while
 * signals kept arriving; we cancel nothing) is issued again too: a positioned read or write of
 * the same bytes is idempotent. */
static int io_rw(ty_store_ssd_t *s, bool write, int fd, void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    for (int retries = 0; done < len;) {
        int res = io_once(s, write, fd, (uint8_t *)buf + done, len - done, off + done);
        if ((res == TY_EINTR || res == TY_EAGAIN || res == TY_ECANCELED) && ++retries < 1000)
            continue;
        if (res < 0)
            return res;
        if (res == 0)
            return TY_EIO;
        done += (size_t)res;
    }
    return 0;
}

/* Write or read len bytes (len may exceed one I/O's limit). */
static int io_full(ty_store_ssd_t *s, bool write, int fd, uint8_t *buf, uint64_t len, uint64_t off)
{
    const uint64_t chunk = 64u << 20;
    for (uint64_t done = 0; done < len; done += chunk) {
        uint64_t n = len - done < chunk ? len - done : chunk;
        int rc = io_rw(s, write, fd, buf + done, n, off + done);
        if (rc == TY_EINVAL && s->direct) {
            /* The filesystem took O_DIRECT at open but refuses it for I/O: go buffered. */
            TY_LOG_WARN("store", "%s: O_DIRECT I/O refused; using buffered I/O", s->dir);
            s->direct = false;
            for (size_t i = 0; i < s->nb; i++)
                fcntl(s->b[i].fd, F_SETFL, fcntl(s->b[i].fd, F_GETFL) & ~O_DIRECT);
            rc = io_rw(s, write, fd, buf + done, n, off + done);
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

static void bucket_path(const ty_store_ssd_t *s, uint32_t id, const char *ext, char *out,
                        size_t cap)
{
    snprintf(out, cap, "%s/bucket-%08u.%s", s->dir, id, ext);
}

static int bucket_open_fd(ty_store_ssd_t *s, uint32_t id, bool create)
{
    char path[4096];
    bucket_path(s, id, "bkt", path, sizeof(path));
    int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0);
    int fd = open(path, flags | (s->direct ? O_DIRECT : 0), 0644);
    if (fd < 0)
        return ty_errno();
    return fd;
}

/* ---- index files ----------------------------------------------------------------------------- */

static int write_index(ty_store_ssd_t *s, const struct bucket *bk)
{
    size_t cap = 64, n = 16;
    uint8_t *buf = malloc(cap);
    TY_ASSERT(buf != NULL);
    uint32_t count = 0;
    for (size_t i = 0; i < s->n_map; i++)
        for (struct ent *e = s->map[i]; e; e = e->next) {
            if (e->bucket != bk->id)
                continue;
            uint16_t kl = (uint16_t)strlen(e->key);
            while (n + 2 + kl + 24 > cap) {
                cap *= 2;
                buf = realloc(buf, cap);
                TY_ASSERT(buf != NULL);
            }
            memcpy(buf + n, &kl, 2);
            memcpy(buf + n + 2, e->key, kl);
            memcpy(buf + n + 2 + kl, &e->off, 8);
            memcpy(buf + n + 10 + kl, &e->data_len, 8);
            memcpy(buf + n + 18 + kl, &e->checksum, 8);
            n += 26 + kl;
            count++;
        }
    uint32_t magic = IDX_MAGIC;
    uint64_t sum = XXH3_64bits(buf + 16, n - 16);
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &count, 4);
    memcpy(buf + 8, &sum, 8);
    char path[4096], tmp[4200];
    bucket_path(s, bk->id, "idx", path, sizeof(path));
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int rc = 0;
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(buf, 1, n, f) != n)
        rc = ty_errno();
    if (f && fclose(f) != 0 && rc == 0)
        rc = ty_errno();
    if (rc == 0 && rename(tmp, path) != 0)
        rc = ty_errno();
    free(buf);
    if (rc != 0)
        TY_LOG_WARN("store", "%s: index not written: %s", path, ty_strerror(rc));
    return rc;
}

/* Load bucket bk's index file. Returns 0, or an error when it is missing or damaged. */
static int load_index(ty_store_ssd_t *s, const struct bucket *bk)
{
    char path[4096];
    bucket_path(s, bk->id, "idx", path, sizeof(path));
    FILE *f = fopen(path, "rb");
    if (!f)
        return ty_errno();
    uint8_t *buf = NULL;
    long n = (fseek(f, 0, SEEK_END) == 0) ? ftell(f) : -1;
    int rc = TY_EFORMAT;
    if (n >= 16 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n)) &&
        fread(buf, 1, (size_t)n, f) == (size_t)n) {
        uint32_t magic, count;
        uint64_t sum;
        memcpy(&magic, buf, 4);
        memcpy(&count, buf + 4, 4);
        memcpy(&sum, buf + 8, 8);
        if (magic == IDX_MAGIC && sum == XXH3_64bits(buf + 16, (size_t)n - 16))
            rc = 0;
        size_t p = 16;
        for (uint32_t i = 0; rc == 0 && i < count; i++) {
            uint16_t kl;
            char key[TY_STORE_KEY_MAX + 1];
            uint64_t off, len, cs;
            if (p + 2 > (size_t)n || (memcpy(&kl, buf + p, 2), kl == 0) || kl > TY_STORE_KEY_MAX ||
                p + 26 + kl > (size_t)n || memchr(buf + p + 2, 0, kl)) { /* keys hold no NUL */
                rc = TY_EFORMAT;
                break;
            }
            memcpy(key, buf + p + 2, kl);
            key[kl] = 0;
            memcpy(&off, buf + p + 2 + kl, 8);
            memcpy(&len, buf + p + 10 + kl, 8);
            memcpy(&cs, buf + p + 18 + kl, 8);
            p += 26 + kl;
            /* bounds first, so that rec_size() and the sum cannot wrap */
            if (off % SSD_ALIGN != 0 || off > bk->size || len > bk->size ||
                off + rec_size(kl, len) > bk->size) {
                rc = TY_EFORMAT;
                break;
            }
            ent_add(s, key, bk->id, off, len, cs);
            s->st.blocks_rescanned++;
        }
    }
    free(buf);
    fclose(f);
    return rc;
}

/* No usable index: walk the records from the start until one does not parse. */
static void scan_bucket(ty_store_ssd_t *s, struct bucket *bk)
{
    uint8_t *page;
    if (posix_memalign((void **)&page, SSD_ALIGN, SSD_ALIGN) != 0)
        return;
    uint64_t off = 0;
    while (off + SSD_ALIGN <= bk->size) {
        if (io_full(s, false, bk->fd, page, SSD_ALIGN, off) != 0)
            break;
        struct rec_hdr h;
        memcpy(&h, page, sizeof(h));
        char key[TY_STORE_KEY_MAX + 1];
        if (h.magic != REC_MAGIC || h.key_len == 0 || h.key_len > TY_STORE_KEY_MAX ||
            memchr(page + sizeof(h), 0, h.key_len)) /* keys hold no NUL */
            break;
        memcpy(key, page + sizeof(h), h.key_len);
        key[h.key_len] = 0;
        if (h.data_len > bk->size - off) /* before rec_size(), which would wrap */
            break;
        uint64_t rs = rec_size(h.key_len, h.data_len);
        if (hdr_check(&h, key) != h.hdr_check || rs > bk->size - off)
            break;
        ent_add(s, key, bk->id, off, h.data_len, h.checksum);
        s->st.blocks_rescanned++;
        off += rs;
    }
    if (off < bk->size)
        TY_LOG_WARN("store", "%s: bucket %u: %llu trailing bytes not parsed", s->dir, bk->id,
                    (unsigned long long)(bk->size - off));
    bk->size = off;
    free(page);
}

/* ---- buckets ------------------------------------------------------------------------------- */

static void bucket_push(ty_store_ssd_t *s, struct bucket bk)
{
    if (s->nb == s->capb) {
        s->capb = s->capb ? s->capb * 2 : 16;
        s->b = realloc(s->b, s->capb * sizeof(*s->b));
        TY_ASSERT(s->b != NULL);
    }
    s->b[s->nb++] = bk;
}

static void seal_last(ty_store_ssd_t *s)
{
    if (s->nb == 0 || s->b[s->nb - 1].sealed)
        return;
    s->b[s->nb - 1].sealed = true;
    write_index(s, &s->b[s->nb - 1]);
}

/* Delete the oldest bucket and the blocks in it (reported as dropped). */
static void evict_oldest(ty_store_ssd_t *s)
{
    struct bucket bk = s->b[0];
    for (size_t i = 0; i < s->n_map; i++)
        for (struct ent **pp = &s->map[i]; *pp;)
            if ((*pp)->bucket == bk.id)
                ent_del(s, pp, true);
            else
                pp = &(*pp)->next;
    close(bk.fd);
    char path[4096];
    bucket_path(s, bk.id, "bkt", path, sizeof(path));
    unlink(path);
    bucket_path(s, bk.id, "idx", path, sizeof(path));
    unlink(path);
    s->total -= bk.size;
    memmove(s->b, s->b + 1, (s->nb - 1) * sizeof(*s->b));
    s->nb--;
    s->st.buckets_evicted++;
    TY_LOG_INFO("store", "%s: bucket %u deleted for space", s->dir, bk.id);
}

static int bucket_new(ty_store_ssd_t *s)
{
    if (s->next_id > BUCKET_ID_MAX)
        return TY_ENOSPC; /* 2^24 buckets written in this directory: no id left */
    seal_last(s);
    int fd = bucket_open_fd(s, s->next_id, true);
    if (fd < 0)
        return fd;
    bucket_push(s, (struct bucket){.id = s->next_id++, .fd = fd});
    return 0;
}

/* A bucket file name exactly as bucket_path() writes it ("bucket-" 8 digits ".bkt"), so that
 * "bucket-1.bkt" is not taken for bucket 1 (opened twice, its bytes counted twice). Ids stop
 * at BUCKET_ID_MAX: the location keeps 24 bits of id and the name 8 digits. */
static bool bucket_name_parse(const char *name, uint32_t *id)
{
    if (strlen(name) != 19 || strncmp(name, "bucket-", 7) != 0 || strcmp(name + 15, ".bkt") != 0)
        return false;
    uint32_t v = 0;
    for (int i = 7; i < 15; i++) {
        if (name[i] < '0' || name[i] > '9')
            return false;
        v = v * 10 + (uint32_t)(name[i] - '0');
    }
    if (v > BUCKET_ID_MAX)
        return false;
    *id = v;
    return true;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int rescan(ty_store_ssd_t *s)
{
    DIR *d = opendir(s->dir);
    if (!d)
        return ty_errno();
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint32_t id;
        if (!bucket_name_parse(de->d_name, &id))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            ids = realloc(ids, cap * sizeof(*ids));
            TY_ASSERT(ids != NULL);
        }
        ids[n++] = id;
    }
    closedir(d);
    if (n > 1)
        qsort(ids, n, sizeof(*ids), cmp_u32);
    for (size_t i = 0; i < n; i++) {
        int fd = bucket_open_fd(s, ids[i], false);
        struct stat sb;
        s->next_id = ids[i] + 1; /* also past a bucket skipped here: its name stays taken */
        if (fd < 0 || fstat(fd, &sb) != 0) {
            TY_LOG_WARN("store", "%s: bucket %u unreadable: skipped", s->dir, ids[i]);
            if (fd >= 0)
                close(fd);
            continue;
        }
        struct bucket bk = {.id = ids[i],
                            .fd = fd,
                            .size = (uint64_t)sb.st_size / SSD_ALIGN * SSD_ALIGN,
                            .sealed = true};
        if (load_index(s, &bk) != 0) {
            scan_bucket(s, &bk);
            write_index(s, &bk);
        }
        s->total += bk.size;
        bucket_push(s, bk);
    }
    free(ids);
    return 0;
}

/* Decide O_DIRECT with a probe file. */
static int probe_direct(ty_store_ssd_t *s, enum ty_store_ssd_direct mode)
{
    s->direct = false;
    if (mode == TY_STORE_SSD_DIRECT_OFF)
        return 0;
    char path[4096];
    snprintf(path, sizeof(path), "%s/.direct-probe", s->dir);
    int fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        close(fd);
        unlink(path);
        s->direct = true;
        return 0;
    }
    int err = ty_errno();
    unlink(path);
    if (mode == TY_STORE_SSD_DIRECT_ON)
        return err == TY_EINVAL ? TY_ENOTSUP : err;
    TY_LOG_WARN("store", "%s: O_DIRECT not supported here (%s): buffered I/O", s->dir,
                ty_strerror(err));
    return 0;
}

int ty_store_ssd_new(ty_store_ssd_t **out, const struct ty_store_ssd_opts *opts)
{
    if (!opts || !opts->dir || !*opts->dir || opts->capacity < SSD_ALIGN ||
        (unsigned)opts->direct > TY_STORE_SSD_DIRECT_OFF)
        return TY_EINVAL;
    if (mkdir(opts->dir, 0755) != 0 && errno != EEXIST)
        return ty_errno();
    ty_store_ssd_t *s = calloc(1, sizeof(*s));
    TY_ASSERT(s != NULL);
    pthread_mutex_init(&s->mu, NULL);
    s->dir = strdup(opts->dir);
    TY_ASSERT(s->dir != NULL);
    s->capacity = opts->capacity;
    s->bucket_bytes = opts->bucket_bytes ? opts->bucket_bytes : 64u << 20;
    s->n_map = 1024;
    s->map = calloc(s->n_map, sizeof(*s->map));
    TY_ASSERT(s->map != NULL);
    int rc = probe_direct(s, opts->direct);
    if (rc == 0)
        rc = io_uring_queue_init(8, &s->ring, 0);
    if (rc != 0) {
        free(s->map);
        free(s->dir);
        free(s);
        return rc;
    }
    rc = rescan(s);
    if (rc != 0) {
        ty_store_ssd_free(s);
        return rc;
    }
    TY_LOG_INFO("store", "ssd tier %s: %zu blocks in %zu buckets, %s I/O", s->dir, s->n_ents, s->nb,
                s->direct ? "O_DIRECT" : "buffered");
    *out = s;
    return 0;
}

void ty_store_ssd_free(ty_store_ssd_t *s)
{
    if (!s)
        return;
    seal_last(s);
    for (size_t i = 0; i < s->nb; i++)
        close(s->b[i].fd);
    for (size_t i = 0; i < s->n_map; i++)
        for (struct ent *e = s->map[i], *next; e; e = next) {
            next = e->next;
            free(e->key);
            free(e);
        }
    io_uring_queue_exit(&s->ring);
    pthread_mutex_destroy(&s->mu);
    free(s->map);
    free(s->b);
    free(s->dropped);
    free(s->dir);
    free(s);
}

/* ---- blocks ---------------------------------------------------------------------------------- */

/* Make room for a record of rs bytes (rs <= capacity) at the end of the open bucket. The open
 * bucket is never deleted here: when it is the only one left and the record still does not fit
 * the budget, it is sealed and a new one opened, so the old one can go. */
static int make_room(ty_store_ssd_t *s, uint64_t rs)
{
    for (;;) {
        struct bucket *last = s->nb ? &s->b[s->nb - 1] : NULL;
        if (!last || last->sealed || (last->size > 0 && last->size + rs > s->bucket_bytes) ||
            (s->nb == 1 && last->size > 0 && s->total + rs > s->capacity)) {
            int rc = bucket_new(s);
            if (rc != 0)
                return rc;
        }
        while (s->total + rs > s->capacity && s->nb > 1)
            evict_oldest(s);
        if (s->total + rs <= s->capacity)
            return 0;
        if (s->b[s->nb - 1].size == 0)
            return TY_EFBIG; /* only an empty bucket is left: cannot happen while rs <= capacity */
    }
}

static int put_locked(ty_store_ssd_t *s, const char *key, const void *data, uint64_t len,
                      uint64_t checksum, uint64_t *loc)
{
    uint64_t h;
    if (*map_slot(s, key, &h))
        return TY_EEXIST;
    size_t kl = strlen(key);
    uint64_t rs = rec_size(kl, len);
    if (rs > s->capacity)
        return TY_EFBIG;
    int rc = make_room(s, rs);
    if (rc != 0)
        return rc;
    uint8_t *buf;
    if (posix_memalign((void **)&buf, SSD_ALIGN, rs) != 0)
        return TY_ENOMEM;
    struct rec_hdr hd = {.magic = REC_MAGIC,
                         .version = 1,
                         .key_len = (uint16_t)kl,
                         .data_len = len,
                         .checksum = checksum};
    hd.hdr_check = hdr_check(&hd, key);
    memcpy(buf, &hd, sizeof(hd));
    memcpy(buf + sizeof(hd), key, kl);
    memcpy(buf + sizeof(hd) + kl, data, len);
    memset(buf + sizeof(hd) + kl + len, 0, rs - sizeof(hd) - kl - len);
    struct bucket *bk = &s->b[s->nb - 1];
    rc = io_full(s, true, bk->fd, buf, rs, bk->size);
    while (rc == TY_ENOSPC && s->nb > 1) { /* the disk is fuller than our budget says */
        evict_oldest(s);
        bk = &s->b[s->nb - 1];
        rc = io_full(s, true, bk->fd, buf, rs, bk->size);
    }
    free(buf);
    if (rc != 0)
        return rc;
    ent_add(s, key, bk->id, bk->size, len, checksum);
    *loc = ((uint64_t)bk->id << LOC_SHIFT) | bk->size;
    bk->size += rs;
    s->total += rs;
    return 0;
}

int ty_store_ssd_put(ty_store_ssd_t *s, const char *key, const void *data, uint64_t len,
                     uint64_t checksum, uint64_t *loc)
{
    if (!key || !*key || strlen(key) > TY_STORE_KEY_MAX || (!data && len > 0) || len == 0)
        return TY_EINVAL;
    pthread_mutex_lock(&s->mu);
    int rc = put_locked(s, key, data, len, checksum, loc);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static struct bucket *bucket_find(ty_store_ssd_t *s, uint32_t id)
{
    for (size_t i = 0; i < s->nb; i++)
        if (s->b[i].id == id)
            return &s->b[i];
    return NULL;
}

static int get_locked(ty_store_ssd_t *s, const char *key, void *out, uint64_t cap, uint64_t *len)
{
    uint64_t h;
    struct ent **pp = map_slot(s, key, &h), *e = *pp;
    if (!e)
        return TY_ENOTFOUND;
    if (e->data_len > cap)
        return TY_ENOSPC;
    struct bucket *bk = bucket_find(s, e->bucket);
    size_t kl = strlen(key);
    uint64_t rs = rec_size(kl, e->data_len);
    uint8_t *buf;
    if (!bk || posix_memalign((void **)&buf, SSD_ALIGN, rs) != 0)
        return bk ? TY_ENOMEM : TY_ENOTFOUND;
    int rc = io_full(s, false, bk->fd, buf, rs, e->off);
    if (rc == 0) {
        struct rec_hdr hd;
        memcpy(&hd, buf, sizeof(hd));
        bool ok = hd.magic == REC_MAGIC && hd.key_len == kl && hd.data_len == e->data_len &&
                  memcmp(buf + sizeof(hd), key, kl) == 0 && hdr_check(&hd, key) == hd.hdr_check &&
                  hd.checksum == e->checksum &&
                  XXH3_64bits(buf + sizeof(hd) + kl, e->data_len) == e->checksum;
        if (ok) {
            memcpy(out, buf + sizeof(hd) + kl, e->data_len);
            *len = e->data_len;
        } else {
            TY_LOG_WARN("store", "%s: block %s in bucket %u fails its checksum: dropped", s->dir,
                        key, e->bucket);
            s->st.checksum_errors++;
            ent_del(s, pp, true);
            rc = TY_ECHECKSUM;
        }
    }
    free(buf);
    return rc;
}

int ty_store_ssd_get(ty_store_ssd_t *s, const char *key, void *buf, uint64_t cap, uint64_t *len)
{
    if (!key || !*key)
        return TY_EINVAL;
    pthread_mutex_lock(&s->mu);
    int rc = get_locked(s, key, buf, cap, len);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int ty_store_ssd_remove(ty_store_ssd_t *s, const char *key)
{
    if (!key || !*key)
        return TY_EINVAL;
    pthread_mutex_lock(&s->mu);
    uint64_t h;
    struct ent **pp = map_slot(s, key, &h);
    int rc = *pp ? 0 : TY_ENOTFOUND;
    if (*pp)
        ent_del(s, pp, false);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int ty_store_ssd_foreach(ty_store_ssd_t *s, ty_store_ssd_block_cb cb, void *arg)
{
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < s->n_map; i++)
        for (struct ent *e = s->map[i]; rc == 0 && e; e = e->next)
            rc = cb(e->key, ((uint64_t)e->bucket << LOC_SHIFT) | e->off, e->data_len, e->checksum,
                    arg);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

size_t ty_store_ssd_take_dropped(ty_store_ssd_t *s, char (*keys)[256], size_t cap)
{
    pthread_mutex_lock(&s->mu);
    size_t n = s->n_dropped < cap ? s->n_dropped : cap;
    if (n > 0) {
        memcpy(keys, s->dropped, n * sizeof(*keys));
        memmove(s->dropped, s->dropped + n, (s->n_dropped - n) * sizeof(*keys));
        s->n_dropped -= n;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

void ty_store_ssd_stats(ty_store_ssd_t *s, struct ty_store_ssd_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->blocks = s->n_ents;
    out->buckets = s->nb;
    out->direct = s->direct;
    pthread_mutex_unlock(&s->mu);
}
