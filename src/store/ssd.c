/* SSD tier: append-only bucket files through io_uring, checksummed reads, rescan on open
 * (store_ssd.h). Record: struct rec_hdr | key | bytes | zero padding to SSD_ALIGN. A remove
 * appends a tombstone: the same header with data_len REC_TOMBSTONE, the key, no bytes (one
 * page). Index file: {u32 IDX_MAGIC, u32 count, u64 XXH3 of the rest}, then per record in file
 * order {u16 key_len, key, u64 off, u64 data_len (REC_TOMBSTONE: a tombstone), u64 checksum}.
 * The rescan applies the records of the buckets oldest first, each in file order: a put
 * replaces what the key held, a tombstone deletes it. Deleting buckets for space stays right
 * with tombstones: only the oldest bucket is ever deleted, and every copy a tombstone deleted
 * lies in its bucket or an older one, so it is gone first. Version-1 files from before
 * tombstones read the same: their records and indexes are a subset of this format. */
#include "tycho/store_ssd.h"

#include "keymap-impl.h"

#include "tycho/errors.h"
#include "tycho/log.h"
#include "tycho/store_meta.h"
#include "tycho/xxh3.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SSD_ALIGN 4096u
#define REC_MAGIC 0x564b5954u /* "TYKV" */
#define IDX_MAGIC 0x58495954u /* "TYIX" */
#define LOC_SHIFT 40          /* loc = bucket id << 40 | offset in the bucket */

#define REC_VERSION   1
#define REC_TOMBSTONE UINT64_MAX /* data_len of a tombstone (no bytes follow the key) */

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
    struct ty__store_kent k; /* first: kent pointers convert to ent */
    uint32_t bucket;
    uint64_t off, data_len, checksum;
};

/* A tombstone of a bucket whose index is not written yet (the open bucket; a bucket being
 * rescanned without an index): write_index lists it. */
struct tomb {
    char *key;
    uint64_t off;
};

struct bucket {
    uint32_t id;
    int fd;
    uint64_t size;
    bool sealed;
    struct tomb *tombs; /* until the index is written */
    size_t n_tombs, cap_tombs;
};

struct ty_store_ssd {
    pthread_mutex_t mu;
    char *dir;
    uint64_t capacity, bucket_bytes, total;
    bool direct;
    bool ring_broken;   /* a submit or wait failed for good: every I/O fails with TY_EIO */
    bool buf_in_flight; /* a wait failed with its request still running: see io_buf_free */
    uint64_t io_seq;    /* tag of the last request (user_data) */
    struct io_uring ring;
    struct bucket *b; /* oldest first; the last one is open for appends unless sealed */
    size_t nb, capb;
    uint32_t next_id;
    struct ty__store_kmap map; /* key -> struct ent */
    char (*dropped)[256];
    size_t n_dropped, cap_dropped;
    const struct ent *removing; /* remove_locked's entry: its bucket deleted, not reported */
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

static struct ent *ent_of(struct ty__store_kent *k)
{
    return (struct ent *)k;
}

static struct ty__store_kent **map_slot(const ty_store_ssd_t *s, const char *key, uint64_t *hash)
{
    return ty__store_kmap_slot(&s->map, key, hash);
}

static void ent_add(ty_store_ssd_t *s, const char *key, uint32_t bucket, uint64_t off, uint64_t len,
                    uint64_t checksum)
{
    ty__store_kmap_reserve(&s->map);
    uint64_t h;
    struct ty__store_kent **pp = map_slot(s, key, &h);
    if (*pp) {
        /* The newest copy wins: buckets are read oldest first and a put refuses a key held, so a
         * later copy was put after the earlier one was removed or dropped (a bad checksum). The
         * first copy winning made a restart bring back the dropped block over the good one. */
        struct ent *e = ent_of(*pp);
        s->st.bytes_used = s->st.bytes_used - e->data_len + len;
        e->bucket = bucket;
        e->off = off;
        e->data_len = len;
        e->checksum = checksum;
        return;
    }
    struct ent *e = calloc(1, sizeof(*e));
    TY_ASSERT(e != NULL);
    *e = (struct ent){.k = {.key = strdup(key), .hash = h},
                      .bucket = bucket,
                      .off = off,
                      .data_len = len,
                      .checksum = checksum};
    TY_ASSERT(e->k.key != NULL);
    *pp = &e->k;
    s->map.n++;
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

/* Unlink *pp and free it. The entry a remove is writing the tombstone of is never reported:
 * the caller removed it (a report would make the master drop the copy an OFFLOAD puts next). */
static void ent_del(ty_store_ssd_t *s, struct ty__store_kent **pp, bool report)
{
    struct ent *e = ent_of(*pp);
    *pp = e->k.next;
    if (e == s->removing)
        s->removing = NULL; /* tells remove_locked that its block is gone already */
    else if (report)
        note_dropped(s, e->k.key);
    s->map.n--;
    s->st.bytes_used -= e->data_len;
    free(e->k.key);
    free(e);
}

/* A tombstone read back (rescan): the key holds nothing from here on. */
static void tomb_apply(ty_store_ssd_t *s, const char *key)
{
    uint64_t h;
    struct ty__store_kent **pp = map_slot(s, key, &h);
    if (*pp)
        ent_del(s, pp, false);
}

static void tomb_add(struct bucket *bk, const char *key, uint64_t off)
{
    if (bk->n_tombs == bk->cap_tombs) {
        bk->cap_tombs = bk->cap_tombs ? bk->cap_tombs * 2 : 16;
        bk->tombs = realloc(bk->tombs, bk->cap_tombs * sizeof(*bk->tombs));
        TY_ASSERT(bk->tombs != NULL);
    }
    char *k = strdup(key);
    TY_ASSERT(k != NULL);
    bk->tombs[bk->n_tombs++] = (struct tomb){.key = k, .off = off};
}

static void tombs_free(struct bucket *bk)
{
    for (size_t i = 0; i < bk->n_tombs; i++)
        free(bk->tombs[i].key);
    free(bk->tombs);
    bk->tombs = NULL;
    bk->n_tombs = bk->cap_tombs = 0;
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
            s->ring_broken = true;   /* our ring is unusable: no further I/O goes through it */
            s->buf_in_flight = true; /* and request `tag` may still be moving bytes */
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

/* Buffers of requests left running when their wait failed (io_wait). The kernel may still read
 * or write such a buffer at any time, also after the ring is torn down (a closing ring cancels
 * and waits for its requests in a kernel worker, not in close), so it is never freed; the list
 * keeps it reachable for leak checkers. At most one per tier: a broken ring takes no request. */
static pthread_mutex_t g_lost_mu = PTHREAD_MUTEX_INITIALIZER;
struct lost_buf {
    void *buf;
    struct lost_buf *next;
};
static struct lost_buf *g_lost;

/* Free buf, the buffer of the tier's last I/O, or park it for good if that I/O may still be in
 * flight. Every buffer given to io_full is released here, on success and on error alike. (A
 * failed submit needs no parking: without SQPOLL the kernel reads a queued SQE only inside
 * io_uring_enter, and a broken ring never enters again.) */
static void io_buf_free(ty_store_ssd_t *s, void *buf)
{
    if (!s->buf_in_flight) {
        free(buf);
        return;
    }
    s->buf_in_flight = false;
    struct lost_buf *l = malloc(sizeof(*l));
    TY_ASSERT(l != NULL);
    l->buf = buf;
    pthread_mutex_lock(&g_lost_mu);
    l->next = g_lost;
    g_lost = l;
    pthread_mutex_unlock(&g_lost_mu);
    TY_LOG_WARN("store", "%s: a buffer of a request still in flight is kept for good", s->dir);
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

struct idx_ent {
    const char *key;
    uint64_t off, data_len, checksum;
};

static int cmp_idx_off(const void *a, const void *b)
{
    uint64_t x = ((const struct idx_ent *)a)->off, y = ((const struct idx_ent *)b)->off;
    return x < y ? -1 : x > y;
}

/* The records of bk that count, in file order: its live blocks and its tombstones (the order
 * matters only for a key removed and put again within the bucket). */
static struct idx_ent *index_entries(const ty_store_ssd_t *s, const struct bucket *bk, size_t *n)
{
    size_t cap = bk->n_tombs + 16, k = 0;
    struct idx_ent *v = malloc(cap * sizeof(*v));
    TY_ASSERT(v != NULL);
    for (size_t i = 0; i < s->map.cap; i++)
        for (struct ty__store_kent *kn = s->map.v[i]; kn; kn = kn->next) {
            const struct ent *e = ent_of(kn);
            if (e->bucket != bk->id)
                continue;
            if (k == cap) {
                cap *= 2;
                v = realloc(v, cap * sizeof(*v));
                TY_ASSERT(v != NULL);
            }
            v[k++] = (struct idx_ent){kn->key, e->off, e->data_len, e->checksum};
        }
    if (k + bk->n_tombs > cap) {
        v = realloc(v, (k + bk->n_tombs) * sizeof(*v));
        TY_ASSERT(v != NULL);
    }
    for (size_t i = 0; i < bk->n_tombs; i++)
        v[k++] = (struct idx_ent){bk->tombs[i].key, bk->tombs[i].off, REC_TOMBSTONE, 0};
    if (k > 1)
        qsort(v, k, sizeof(*v), cmp_idx_off);
    *n = k;
    return v;
}

static int write_index(ty_store_ssd_t *s, const struct bucket *bk)
{
    size_t cap = 64, n = 16, count;
    uint8_t *buf = malloc(cap);
    TY_ASSERT(buf != NULL);
    struct idx_ent *v = index_entries(s, bk, &count);
    for (size_t i = 0; i < count; i++) {
        uint16_t kl = (uint16_t)strlen(v[i].key);
        while (n + 26 + kl > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            TY_ASSERT(buf != NULL);
        }
        memcpy(buf + n, &kl, 2);
        memcpy(buf + n + 2, v[i].key, kl);
        memcpy(buf + n + 2 + kl, &v[i].off, 8);
        memcpy(buf + n + 10 + kl, &v[i].data_len, 8);
        memcpy(buf + n + 18 + kl, &v[i].checksum, 8);
        n += 26 + kl;
    }
    free(v);
    uint32_t magic = IDX_MAGIC, count32 = (uint32_t)count;
    uint64_t sum = XXH3_64bits(buf + 16, n - 16);
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &count32, 4);
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
            bool tomb = len == REC_TOMBSTONE;
            uint64_t dl = tomb ? 0 : len;
            /* bounds first, so that rec_size() and the sum cannot wrap */
            if (off % SSD_ALIGN != 0 || off > bk->size || dl > bk->size ||
                off + rec_size(kl, dl) > bk->size) {
                rc = TY_EFORMAT;
                break;
            }
            if (tomb) {
                tomb_apply(s, key);
                continue;
            }
            ent_add(s, key, bk->id, off, len, cs);
            s->st.blocks_rescanned++;
        }
    }
    free(buf);
    fclose(f);
    return rc;
}

/* No usable index: walk the records from the start until one does not parse. The tombstones
 * met are kept in bk->tombs for the index written next. */
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
        if (h.magic != REC_MAGIC || h.version != REC_VERSION || h.key_len == 0 ||
            h.key_len > TY_STORE_KEY_MAX ||
            memchr(page + sizeof(h), 0, h.key_len)) /* keys hold no NUL */
            break;
        memcpy(key, page + sizeof(h), h.key_len);
        key[h.key_len] = 0;
        bool tomb = h.data_len == REC_TOMBSTONE;
        uint64_t dl = tomb ? 0 : h.data_len;
        if (dl > bk->size - off) /* before rec_size(), which would wrap */
            break;
        uint64_t rs = rec_size(h.key_len, dl);
        if (hdr_check(&h, key) != h.hdr_check || rs > bk->size - off)
            break;
        if (tomb) {
            tomb_apply(s, key);
            tomb_add(bk, key, off);
        } else {
            ent_add(s, key, bk->id, off, h.data_len, h.checksum);
            s->st.blocks_rescanned++;
        }
        off += rs;
    }
    if (off < bk->size)
        TY_LOG_WARN("store", "%s: bucket %u: %llu trailing bytes not parsed", s->dir, bk->id,
                    (unsigned long long)(bk->size - off));
    bk->size = off;
    io_buf_free(s, page);
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
    tombs_free(&s->b[s->nb - 1]); /* the index lists them now, or else the records do */
}

/* Delete the oldest bucket and the blocks in it (reported as dropped). */
static void evict_oldest(ty_store_ssd_t *s)
{
    struct bucket bk = s->b[0];
    for (size_t i = 0; i < s->map.cap; i++)
        for (struct ty__store_kent **pp = &s->map.v[i]; *pp;)
            if (ent_of(*pp)->bucket == bk.id)
                ent_del(s, pp, true);
            else
                pp = &(*pp)->next;
    close(bk.fd);
    tombs_free(&bk);
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
            tombs_free(&bk);
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
    ty__store_kmap_init(&s->map);
    int rc = probe_direct(s, opts->direct);
    if (rc == 0)
        rc = io_uring_queue_init(8, &s->ring, 0);
    if (rc != 0) {
        ty__store_kmap_fini(&s->map);
        free(s->dir);
        free(s);
        return rc;
    }
    rc = rescan(s);
    if (rc != 0) {
        ty_store_ssd_free(s);
        return rc;
    }
    TY_LOG_INFO("store", "ssd tier %s: %zu blocks in %zu buckets, %s I/O", s->dir, s->map.n, s->nb,
                s->direct ? "O_DIRECT" : "buffered");
    *out = s;
    return 0;
}

void ty_store_ssd_free(ty_store_ssd_t *s)
{
    if (!s)
        return;
    seal_last(s);
    for (size_t i = 0; i < s->nb; i++) {
        close(s->b[i].fd);
        tombs_free(&s->b[i]);
    }
    for (size_t i = 0; i < s->map.cap; i++)
        for (struct ty__store_kent *kn = s->map.v[i], *next; kn; kn = next) {
            next = kn->next;
            free(kn->key);
            free(kn);
        }
    io_uring_queue_exit(&s->ring);
    pthread_mutex_destroy(&s->mu);
    ty__store_kmap_fini(&s->map);
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

/* Append the record in buf (rs bytes, a multiple of SSD_ALIGN; rs <= capacity) to the open
 * bucket, deleting the oldest buckets for room. Returns 0 with *bk and *off where it went, or an
 * error (nothing counted as written). The caller releases buf with io_buf_free. */
static int append_record(ty_store_ssd_t *s, uint8_t *buf, uint64_t rs, struct bucket **out,
                         uint64_t *off)
{
    int rc = make_room(s, rs);
    if (rc != 0)
        return rc;
    struct bucket *bk = &s->b[s->nb - 1];
    rc = io_full(s, true, bk->fd, buf, rs, bk->size);
    while (rc == TY_ENOSPC && s->nb > 1) { /* the disk is fuller than our budget says */
        evict_oldest(s);
        bk = &s->b[s->nb - 1];
        rc = io_full(s, true, bk->fd, buf, rs, bk->size);
    }
    if (rc != 0)
        return rc;
    *out = bk;
    *off = bk->size;
    bk->size += rs;
    s->total += rs;
    return 0;
}

/* A record in a fresh aligned buffer of rec_size() bytes: header, key, len bytes of data (none
 * for a tombstone), zero padding. Returns NULL when out of memory. */
static uint8_t *record_build(const char *key, const void *data, uint64_t len, uint64_t checksum,
                             uint64_t *rs)
{
    size_t kl = strlen(key);
    uint64_t dl = len == REC_TOMBSTONE ? 0 : len;
    *rs = rec_size(kl, dl);
    uint8_t *buf;
    if (posix_memalign((void **)&buf, SSD_ALIGN, *rs) != 0)
        return NULL;
    struct rec_hdr hd = {.magic = REC_MAGIC,
                         .version = REC_VERSION,
                         .key_len = (uint16_t)kl,
                         .data_len = len,
                         .checksum = checksum};
    hd.hdr_check = hdr_check(&hd, key);
    memcpy(buf, &hd, sizeof(hd));
    memcpy(buf + sizeof(hd), key, kl);
    if (dl > 0)
        memcpy(buf + sizeof(hd) + kl, data, dl);
    memset(buf + sizeof(hd) + kl + dl, 0, *rs - sizeof(hd) - kl - dl);
    return buf;
}

static int put_locked(ty_store_ssd_t *s, const char *key, const void *data, uint64_t len,
                      uint64_t checksum, uint64_t *loc)
{
    uint64_t h;
    if (*map_slot(s, key, &h))
        return TY_EEXIST;
    if (rec_size(strlen(key), len) > s->capacity)
        return TY_EFBIG;
    uint64_t rs, off;
    uint8_t *buf = record_build(key, data, len, checksum, &rs);
    if (!buf)
        return TY_ENOMEM;
    struct bucket *bk;
    int rc = append_record(s, buf, rs, &bk, &off);
    io_buf_free(s, buf);
    if (rc != 0)
        return rc;
    ent_add(s, key, bk->id, off, len, checksum);
    *loc = ((uint64_t)bk->id << LOC_SHIFT) | off;
    return 0;
}

int ty_store_ssd_put(ty_store_ssd_t *s, const char *key, const void *data, uint64_t len,
                     uint64_t checksum, uint64_t *loc)
{
    if (!key || !*key || strlen(key) > TY_STORE_KEY_MAX || (!data && len > 0) || len == 0 ||
        len == REC_TOMBSTONE)
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
    struct ty__store_kent **pp = map_slot(s, key, &h);
    if (!*pp)
        return TY_ENOTFOUND;
    const struct ent *e = ent_of(*pp);
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
    io_buf_free(s, buf);
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

/* Write key's tombstone, then forget the entry. A crash in between leaves the tombstone: the
 * rescan removes the block. A failed write keeps the entry (the block is still there after a
 * restart), unless making room deleted the entry's own bucket: then it is gone for good, and so
 * is every older copy (older buckets go first). */
static int remove_locked(ty_store_ssd_t *s, const char *key)
{
    uint64_t h, rs, off;
    struct ty__store_kent **pp = map_slot(s, key, &h);
    if (!*pp)
        return TY_ENOTFOUND; /* nothing written */
    uint8_t *buf = record_build(key, NULL, REC_TOMBSTONE, 0, &rs);
    if (!buf)
        return TY_ENOMEM;
    s->removing = ent_of(*pp); /* evict_oldest may delete it (then NULL), and must not report it */
    struct bucket *bk;
    int rc = append_record(s, buf, rs, &bk, &off);
    bool gone = s->removing == NULL;
    s->removing = NULL;
    io_buf_free(s, buf);
    if (rc == 0)
        tomb_add(bk, key, off); /* for the index written when bk is sealed */
    if (gone)
        return 0;
    if (rc != 0)
        return rc;
    ent_del(s, map_slot(s, key, &h), false); /* looked up again: buckets may have gone */
    return 0;
}

int ty_store_ssd_remove(ty_store_ssd_t *s, const char *key)
{
    if (!key || !*key)
        return TY_EINVAL;
    pthread_mutex_lock(&s->mu);
    int rc = strlen(key) > TY_STORE_KEY_MAX ? TY_ENOTFOUND : remove_locked(s, key);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int ty_store_ssd_foreach(ty_store_ssd_t *s, ty_store_ssd_block_cb cb, void *arg)
{
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < s->map.cap; i++)
        for (struct ty__store_kent *kn = s->map.v[i]; rc == 0 && kn; kn = kn->next) {
            const struct ent *e = ent_of(kn);
            rc = cb(kn->key, ((uint64_t)e->bucket << LOC_SHIFT) | e->off, e->data_len,
                    e->checksum, arg);
        }
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
    out->blocks = s->map.n;
    out->buckets = s->nb;
    out->direct = s->direct;
    pthread_mutex_unlock(&s->mu);
}
