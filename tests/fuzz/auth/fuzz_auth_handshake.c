/* libFuzzer target for the cluster handshake (src/common/auth.c), two ways.
 *
 * Byte 0 picks the mode. Raw (bit 0 clear): the rest is a peer's bytes fed to one side (bit 1:
 * server or client; bit 2: keyed or insecure) in chunks of byte 1 + 1 bytes; checked: no more
 * is consumed than given, a message to send is whole, a failed handshake stays failed.
 * Man in the middle (bit 0 set): a real server and client with the same key run the exchange
 * while the rest of the input is XORed into their messages in flight. Checked: once any byte of
 * a nonce or proof a message carries was changed, the two ends never both finish: no tampering
 * passes. */
#include "tycho/auth.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static struct ty_auth key(void)
{
    struct ty_auth a = {0};
    memcpy(a.key, "fuzz-cluster-secret-0123456789ab", 32);
    a.key_len = 32;
    return a;
}

static void raw(const uint8_t *data, size_t size, bool server, bool keyed, size_t chunk)
{
    struct ty_auth k = key();
    struct ty_auth_hs hs;
    ty_auth_hs_init(&hs, keyed ? &k : NULL, server);
    check(hs.out_len == 0 || hs.out_len == TY_AUTH_MSG_SIZE);
    hs.out_len = 0;
    bool failed = false;
    for (size_t off = 0; off < size;) {
        size_t n = size - off < chunk ? size - off : chunk, used = 0;
        int st = ty_auth_hs_feed(&hs, data + off, n, &used);
        check(used <= n);
        check(hs.out_len == 0 || hs.out_len == TY_AUTH_MSG_SIZE);
        hs.out_len = 0;
        if (failed)
            check(st == TY_AUTH_HS_FAILED);
        failed = st == TY_AUTH_HS_FAILED;
        if (st != TY_AUTH_HS_WAIT)
            break;
        off += used ? used : n;
    }
}

static void mitm(const uint8_t *mask, size_t size)
{
    struct ty_auth k = key();
    struct ty_auth_hs s, c;
    ty_auth_hs_init(&s, &k, true);
    ty_auth_hs_init(&c, &k, false);
    bool tampered = false;
    size_t at = 0;
    struct ty_auth_hs *from = &s, *to = &c;
    for (int step = 0; step < 3 && from->out_len; step++) {
        uint8_t m[TY_AUTH_MSG_SIZE];
        memcpy(m, from->out, TY_AUTH_MSG_SIZE);
        from->out_len = 0;
        /* what each message proves with: CHALLENGE its nonce, RESPONSE its nonce and proof,
         * ACCEPT its proof (the other fields of a message carry nothing) */
        size_t lo = step == 2 ? 40 : 8, hi = step == 0 ? 40 : TY_AUTH_MSG_SIZE;
        for (size_t i = 0; i < TY_AUTH_MSG_SIZE && at < size; i++, at++) {
            m[i] ^= mask[at];
            if (mask[at] && i >= lo && i < hi)
                tampered = true;
        }
        size_t used;
        ty_auth_hs_feed(to, m, sizeof(m), &used);
        struct ty_auth_hs *t = from;
        from = to;
        to = t;
    }
    if (tampered)
        check(!(s.state == TY_AUTH_HS_DONE && c.state == TY_AUTH_HS_DONE));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint8_t mode = data[0];
    if (mode & 1)
        mitm(data + 1, size - 1);
    else
        raw(data + 2, size - 2, (mode & 2) != 0, (mode & 4) != 0, (size_t)data[1] + 1);
    return 0;
}
