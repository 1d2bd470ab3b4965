/* RPC frame codec: the 20-byte little-endian header of docs/arch/rpc.md and an incremental,
 * allocation-light decoder. Pure code: no sockets, no globals; fuzzed by tests/fuzz/rpc/. */
#include "tycho/errors.h"
#include "tycho/rpc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Header layout (offsets in bytes). */
#define OFF_MAGIC   0
#define OFF_VERSION 4
#define OFF_KIND    5
#define OFF_METHOD  6
#define OFF_ID      8
#define OFF_LEN     16

static const char *const kind_names[] = {"?",          "request", "response", "stream-item",
                                         "stream-end", "error",   "cancel"};

const char *ty_rpc_kind_name(int kind)
{
    if (kind < TY_RPC_KIND_REQUEST || kind > TY_RPC_KIND_CANCEL)
        return "?";
    return kind_names[kind];
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Write the 20-byte header of `f` (f->len is the payload length) into `out`. */
static void header_encode(uint8_t out[TY_RPC_HEADER_SIZE], const struct ty_rpc_frame *f)
{
    put_le(out + OFF_MAGIC, TY_RPC_MAGIC, 4);
    out[OFF_VERSION] = TY_RPC_VERSION;
    out[OFF_KIND] = (uint8_t)f->kind;
    put_le(out + OFF_METHOD, f->method, 2);
    put_le(out + OFF_ID, f->request_id, 8);
    put_le(out + OFF_LEN, f->len, 4);
}

int ty_rpc_frame_encode(const struct ty_rpc_frame *f, uint8_t *out, size_t cap, size_t *written)
{
    if (f->kind < TY_RPC_KIND_REQUEST || f->kind > TY_RPC_KIND_CANCEL)
        return TY_EINVAL;
    if (f->len > 0 && !f->payload)
        return TY_EINVAL;
    size_t need = TY_RPC_HEADER_SIZE + (size_t)f->len;
    if (cap < need)
        return TY_EMSGSIZE;
    header_encode(out, f);
    if (f->len)
        memcpy(out + TY_RPC_HEADER_SIZE, f->payload, f->len);
    *written = need;
    return 0;
}

int ty_rpc_decoder_init(struct ty_rpc_decoder *d, uint32_t max_payload)
{
    if (max_payload > TY_RPC_MAX_FRAME_LIMIT)
        return TY_EINVAL;
    memset(d, 0, sizeof(*d));
    d->max_payload = max_payload ? max_payload : TY_RPC_DEFAULT_MAX_FRAME;
    return 0;
}

void ty_rpc_decoder_fini(struct ty_rpc_decoder *d)
{
    free(d->buf);
    d->buf = NULL;
    d->buf_cap = 0;
}

const char *ty_rpc_decoder_reason(const struct ty_rpc_decoder *d)
{
    return d->reason;
}

__attribute__((format(printf, 3, 4))) static int fail(struct ty_rpc_decoder *d, int err,
                                                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    d->err = err;
    vsnprintf(d->reason, sizeof(d->reason), fmt, ap);
    va_end(ap);
    return err;
}

/* Validate the complete header in d->hdr and fill d->cur. */
static int parse_header(struct ty_rpc_decoder *d)
{
    const uint8_t *h = d->hdr;
    uint32_t magic = (uint32_t)get_le(h + OFF_MAGIC, 4);
    if (magic != TY_RPC_MAGIC)
        return fail(d, TY_EPROTO, "bad magic 0x%08x", magic);
    if (h[OFF_VERSION] != TY_RPC_VERSION)
        return fail(d, TY_ENOTSUP, "unsupported frame version %u", h[OFF_VERSION]);
    uint8_t kind = h[OFF_KIND];
    if (kind < TY_RPC_KIND_REQUEST || kind > TY_RPC_KIND_CANCEL)
        return fail(d, TY_EBADMSG, "unknown frame kind %u", kind);
    uint32_t len = (uint32_t)get_le(h + OFF_LEN, 4);
    if (len > d->max_payload)
        return fail(d, TY_EMSGSIZE, "frame payload of %u bytes exceeds the maximum %u", len,
                    d->max_payload);
    d->cur.kind = (enum ty_rpc_kind)kind;
    d->cur.method = (uint16_t)get_le(h + OFF_METHOD, 2);
    d->cur.request_id = get_le(h + OFF_ID, 8);
    d->cur.len = len;
    d->cur.payload = NULL;
    d->have_hdr = true;
    d->buf_have = 0;
    return 0;
}

static int ensure_buf(struct ty_rpc_decoder *d, uint32_t need)
{
    if (d->buf_cap >= need)
        return 0;
    uint32_t cap = d->buf_cap ? d->buf_cap : 256;
    while (cap < need)
        cap = cap > UINT32_MAX / 2 ? need : cap * 2;
    uint8_t *nb = realloc(d->buf, cap);
    if (!nb)
        return fail(d, TY_ENOMEM, "cannot buffer a %u-byte payload", need);
    d->buf = nb;
    d->buf_cap = cap;
    return 0;
}

/* Payload phase. Zero-copy when the whole payload is inside this feed; else assemble. */
static int feed_payload(struct ty_rpc_decoder *d, const uint8_t *p, size_t len, size_t *used,
                        struct ty_rpc_frame *out)
{
    uint32_t want = d->cur.len - d->buf_have;
    *used = 0;
    if (len == 0 && want > 0)
        return 0; /* allocate the payload buffer only once payload bytes arrive */
    if (d->buf_have == 0 && len >= want) {
        *out = d->cur;
        out->payload = want ? p : NULL;
        *used = want;
        d->have_hdr = false;
        d->hdr_have = 0;
        return 1;
    }
    int rc = ensure_buf(d, d->cur.len);
    if (rc < 0)
        return rc;
    size_t take = len < want ? len : want;
    memcpy(d->buf + d->buf_have, p, take);
    d->buf_have += (uint32_t)take;
    *used = take;
    if (d->buf_have < d->cur.len)
        return 0;
    *out = d->cur;
    out->payload = d->buf;
    d->have_hdr = false;
    d->hdr_have = 0;
    d->buf_have = 0;
    return 1;
}

int ty_rpc_decoder_feed(struct ty_rpc_decoder *d, const void *data, size_t len, size_t *consumed,
                        struct ty_rpc_frame *out)
{
    const uint8_t *p = data;
    size_t off = 0;
    *consumed = 0;
    if (d->err)
        return d->err;
    while (off < len || d->have_hdr) {
        if (!d->have_hdr) {
            size_t take = TY_RPC_HEADER_SIZE - d->hdr_have;
            if (take > len - off)
                take = len - off;
            memcpy(d->hdr + d->hdr_have, p + off, take);
            d->hdr_have += (uint32_t)take;
            off += take;
            if (d->hdr_have < TY_RPC_HEADER_SIZE)
                break;
            int rc = parse_header(d);
            if (rc < 0) {
                *consumed = off;
                return rc;
            }
            continue;
        }
        size_t used = 0;
        int rc = feed_payload(d, p + off, len - off, &used, out);
        off += used;
        if (rc != 0) {
            *consumed = off;
            return rc;
        }
        break; /* payload incomplete: all input consumed */
    }
    *consumed = off;
    return 0;
}

int ty_rpc_decoder_finish(struct ty_rpc_decoder *d)
{
    if (d->err)
        return d->err;
    if (d->have_hdr)
        return fail(d, TY_ENODATA, "truncated frame at EOF: %u of %u payload bytes", d->buf_have,
                    d->cur.len);
    if (d->hdr_have > 0)
        return fail(d, TY_ENODATA, "truncated frame at EOF: %u of %d header bytes", d->hdr_have,
                    TY_RPC_HEADER_SIZE);
    return 0;
}

int ty_rpc_pack(const ProtobufCMessage *msg, uint8_t **out, size_t *len)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    *out = NULL;
    *len = 0;
    if (n > TY_RPC_MAX_FRAME_LIMIT)
        return TY_EMSGSIZE;
    if (n == 0)
        return 0;
    uint8_t *buf = malloc(n);
    if (!buf)
        return TY_ENOMEM;
    protobuf_c_message_pack(msg, buf);
    *out = buf;
    *len = n;
    return 0;
}
