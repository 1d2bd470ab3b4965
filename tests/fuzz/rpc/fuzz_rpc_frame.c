/* libFuzzer target for the RPC frame decoder (src/common/rpc_frame.c).
 *
 * The first input byte picks the chunk size the rest is fed in (1..256 bytes), so the fuzzer
 * explores every split of headers and payloads. Checked on every step: the decoder consumes no
 * more than it was given, a returned frame respects the maximum and re-encodes to exactly the
 * bytes it came from, errors are sticky, and EOF inside a frame is reported as truncation. */
#include "tycho/errors.h"
#include "tycho/rpc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_PAYLOAD 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t chunk = (size_t)data[0] + 1;
    data++;
    size--;
    struct ty_rpc_decoder d;
    check(ty_rpc_decoder_init(&d, FUZZ_MAX_PAYLOAD) == 0);
    static uint8_t reenc[TY_RPC_HEADER_SIZE + FUZZ_MAX_PAYLOAD];
    size_t off = 0, frame_start = 0;
    int err = 0;
    while (off < size && !err) {
        size_t n = size - off < chunk ? size - off : chunk, sub = 0;
        while (sub < n) {
            struct ty_rpc_frame f;
            size_t used = 0;
            int rc = ty_rpc_decoder_feed(&d, data + off + sub, n - sub, &used, &f);
            check(used <= n - sub);
            sub += used;
            if (rc < 0) {
                err = rc;
                break;
            }
            if (rc == 0) {
                check(sub == n);
                break;
            }
            check(rc == 1 && f.len <= FUZZ_MAX_PAYLOAD);
            size_t end = off + sub, w = 0;
            check(ty_rpc_frame_encode(&f, reenc, sizeof(reenc), &w) == 0);
            check(w == end - frame_start && memcmp(reenc, data + frame_start, w) == 0);
            frame_start = end;
        }
        off += sub;
        if (!err)
            check(sub == n);
    }
    if (err) {
        check(err == TY_EPROTO || err == TY_ENOTSUP || err == TY_EBADMSG || err == TY_EMSGSIZE);
        struct ty_rpc_frame f;
        size_t used = 1;
        check(ty_rpc_decoder_feed(&d, data, size, &used, &f) == err && used == 0);
        check(ty_rpc_decoder_reason(&d)[0] != 0);
    } else {
        int fin = ty_rpc_decoder_finish(&d);
        check(fin == (frame_start == size ? 0 : TY_ENODATA));
    }
    ty_rpc_decoder_fini(&d);
    return 0;
}
