/* Frame codec tests. Expected bytes are written out by hand from the header layout in
 * docs/arch/rpc.md, not produced by the encoder under test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/errors.h"
#include "tycho/rpc.h"
#include "tycho.pb-c.h"

#include <stdlib.h>
#include <string.h>

/* kind=response(2) method=0x0102 id=0x0807060504030201 len=5 payload "hello" */
// clang-format off
static const uint8_t known_frame[] = {
    0x54, 0x59, 0x52, 0x50,                         /* magic "TYRP" */
    0x01,                                           /* version */
    0x02,                                           /* kind */
    0x02, 0x01,                                     /* method LE */
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, /* request id LE */
    0x05, 0x00, 0x00, 0x00,                         /* payload length LE */
    'h',  'e',  'l',  'l',  'o'};
// clang-format on

static void make_header(uint8_t h[20], uint8_t version, uint8_t kind, uint32_t len)
{
    memcpy(h, known_frame, 20);
    h[4] = version;
    h[5] = kind;
    h[16] = (uint8_t)len;
    h[17] = (uint8_t)(len >> 8);
    h[18] = (uint8_t)(len >> 16);
    h[19] = (uint8_t)(len >> 24);
}

static void test_encode_known_bytes(void **state)
{
    struct ty_rpc_frame f = {.kind = TY_RPC_KIND_RESPONSE,
                             .method = 0x0102,
                             .request_id = 0x0807060504030201ull,
                             .len = 5,
                             .payload = (const uint8_t *)"hello"};
    uint8_t out[64];
    size_t n = 0;
    assert_int_equal(ty_rpc_frame_encode(&f, out, sizeof(out), &n), 0);
    assert_int_equal(n, sizeof(known_frame));
    assert_memory_equal(out, known_frame, sizeof(known_frame));
    assert_int_equal(ty_rpc_frame_encode(&f, out, 24, &n), TY_EMSGSIZE);
    f.kind = 7;
    assert_int_equal(ty_rpc_frame_encode(&f, out, sizeof(out), &n), TY_EINVAL);
    assert_string_equal(ty_rpc_kind_name(TY_RPC_KIND_STREAM_END), "stream-end");
    assert_string_equal(ty_rpc_kind_name(0), "?");
}

static void test_decode_known_bytes(void **state)
{
    struct ty_rpc_decoder d;
    struct ty_rpc_frame f;
    size_t used;
    assert_int_equal(ty_rpc_decoder_init(&d, 0), 0);
    assert_int_equal(ty_rpc_decoder_feed(&d, known_frame, sizeof(known_frame), &used, &f), 1);
    assert_int_equal(used, sizeof(known_frame));
    assert_int_equal(f.kind, TY_RPC_KIND_RESPONSE);
    assert_int_equal(f.method, 0x0102);
    assert_true(f.request_id == 0x0807060504030201ull);
    assert_int_equal(f.len, 5);
    assert_memory_equal(f.payload, "hello", 5);
    assert_int_equal(ty_rpc_decoder_finish(&d), 0);
    ty_rpc_decoder_fini(&d);
}

/* Three frames (one empty) in one buffer, then the same stream one byte at a time. */
static void test_decode_split_and_joined(void **state)
{
    uint8_t stream[3 * sizeof(known_frame)];
    uint8_t empty[20];
    make_header(empty, 1, TY_RPC_KIND_STREAM_END, 0);
    memcpy(stream, known_frame, sizeof(known_frame));
    memcpy(stream + sizeof(known_frame), empty, 20);
    memcpy(stream + sizeof(known_frame) + 20, known_frame, sizeof(known_frame));
    size_t total = 2 * sizeof(known_frame) + 20;

    for (int bytewise = 0; bytewise < 2; bytewise++) {
        struct ty_rpc_decoder d;
        assert_int_equal(ty_rpc_decoder_init(&d, 64), 0);
        int kinds[3], n = 0;
        char text[3][8] = {{0}};
        size_t off = 0;
        while (off < total) {
            size_t chunk = bytewise ? 1 : total - off, used;
            struct ty_rpc_frame f;
            int rc = ty_rpc_decoder_feed(&d, stream + off, chunk, &used, &f);
            assert_true(rc == 0 || rc == 1);
            assert_true(used <= chunk);
            off += used;
            if (rc == 1) {
                assert_true(n < 3);
                kinds[n] = f.kind;
                memcpy(text[n], f.payload ? (const char *)f.payload : "", f.len);
                n++;
            }
        }
        assert_int_equal(n, 3);
        assert_int_equal(kinds[0], TY_RPC_KIND_RESPONSE);
        assert_int_equal(kinds[1], TY_RPC_KIND_STREAM_END);
        assert_int_equal(kinds[2], TY_RPC_KIND_RESPONSE);
        assert_string_equal(text[0], "hello");
        assert_string_equal(text[1], "");
        assert_string_equal(text[2], "hello");
        assert_int_equal(ty_rpc_decoder_finish(&d), 0);
        ty_rpc_decoder_fini(&d);
    }
}

static void expect_error(const uint8_t *bytes, size_t n, uint32_t max, int want, const char *word)
{
    struct ty_rpc_decoder d;
    struct ty_rpc_frame f;
    size_t used;
    assert_int_equal(ty_rpc_decoder_init(&d, max), 0);
    assert_int_equal(ty_rpc_decoder_feed(&d, bytes, n, &used, &f), want);
    assert_non_null(strstr(ty_rpc_decoder_reason(&d), word));
    /* sticky: nothing more is consumed, the same error comes back */
    assert_int_equal(ty_rpc_decoder_feed(&d, known_frame, sizeof(known_frame), &used, &f), want);
    assert_int_equal(used, 0);
    assert_int_equal(ty_rpc_decoder_finish(&d), want);
    ty_rpc_decoder_fini(&d);
}

static void test_bad_magic(void **state)
{
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    expect_error((const uint8_t *)http, strlen(http), 0, TY_EPROTO, "magic");
}

static void test_bad_version(void **state)
{
    uint8_t h[20];
    make_header(h, 2, TY_RPC_KIND_REQUEST, 0);
    expect_error(h, 20, 0, TY_ENOTSUP, "version");
    make_header(h, 0, TY_RPC_KIND_REQUEST, 0);
    expect_error(h, 20, 0, TY_ENOTSUP, "version");
}

static void test_unknown_kind(void **state)
{
    uint8_t h[20];
    make_header(h, 1, 0, 0);
    expect_error(h, 20, 0, TY_EBADMSG, "kind");
    make_header(h, 1, 7, 0);
    expect_error(h, 20, 0, TY_EBADMSG, "kind");
    make_header(h, 1, 0xff, 0);
    expect_error(h, 20, 0, TY_EBADMSG, "kind");
}

/* Oversize is detected from the header alone, before any payload byte arrives. */
static void test_oversized(void **state)
{
    uint8_t h[20];
    make_header(h, 1, TY_RPC_KIND_REQUEST, 1025);
    expect_error(h, 20, 1024, TY_EMSGSIZE, "exceeds");
    make_header(h, 1, TY_RPC_KIND_REQUEST, 0xffffffffu);
    expect_error(h, 20, 0, TY_EMSGSIZE, "exceeds");

    /* exactly the maximum is fine */
    uint8_t *buf = calloc(1, 20 + 1024);
    make_header(buf, 1, TY_RPC_KIND_REQUEST, 1024);
    struct ty_rpc_decoder d;
    struct ty_rpc_frame f;
    size_t used;
    assert_int_equal(ty_rpc_decoder_init(&d, 1024), 0);
    assert_int_equal(ty_rpc_decoder_feed(&d, buf, 20 + 1024, &used, &f), 1);
    assert_int_equal(f.len, 1024);
    ty_rpc_decoder_fini(&d);
    free(buf);
    assert_int_equal(ty_rpc_decoder_init(&d, TY_RPC_MAX_FRAME_LIMIT + 1), TY_EINVAL);
}

static void test_truncated_at_eof(void **state)
{
    struct ty_rpc_decoder d;
    struct ty_rpc_frame f;
    size_t used;
    /* in the header */
    assert_int_equal(ty_rpc_decoder_init(&d, 0), 0);
    assert_int_equal(ty_rpc_decoder_feed(&d, known_frame, 10, &used, &f), 0);
    assert_int_equal(used, 10);
    assert_int_equal(ty_rpc_decoder_finish(&d), TY_ENODATA);
    assert_non_null(strstr(ty_rpc_decoder_reason(&d), "10 of 20 header"));
    ty_rpc_decoder_fini(&d);
    /* in the payload */
    assert_int_equal(ty_rpc_decoder_init(&d, 0), 0);
    assert_int_equal(ty_rpc_decoder_feed(&d, known_frame, 22, &used, &f), 0);
    assert_int_equal(ty_rpc_decoder_finish(&d), TY_ENODATA);
    assert_non_null(strstr(ty_rpc_decoder_reason(&d), "2 of 5 payload"));
    ty_rpc_decoder_fini(&d);
    /* header complete, no payload byte yet */
    assert_int_equal(ty_rpc_decoder_init(&d, 0), 0);
    assert_int_equal(ty_rpc_decoder_feed(&d, known_frame, 20, &used, &f), 0);
    assert_int_equal(ty_rpc_decoder_finish(&d), TY_ENODATA);
    ty_rpc_decoder_fini(&d);
}

/* Random frames cut at random points decode back to the same frames, in order. */
static void test_random_splits(void **state)
{
    enum { N = 200 };
    size_t cap = N * (20 + 300), total = 0;
    uint8_t *stream = malloc(cap);
    uint32_t lens[N];
    srand(12345);
    for (int i = 0; i < N; i++) {
        uint8_t payload[300];
        lens[i] = (uint32_t)(rand() % 300);
        for (uint32_t j = 0; j < lens[i]; j++)
            payload[j] = (uint8_t)(i + j);
        struct ty_rpc_frame f = {.kind = TY_RPC_KIND_STREAM_ITEM,
                                 .method = 6,
                                 .request_id = 1000 + (uint64_t)i,
                                 .len = lens[i],
                                 .payload = payload};
        size_t n;
        assert_int_equal(ty_rpc_frame_encode(&f, stream + total, cap - total, &n), 0);
        total += n;
    }
    struct ty_rpc_decoder d;
    assert_int_equal(ty_rpc_decoder_init(&d, 300), 0);
    int got = 0;
    size_t off = 0;
    while (off < total) {
        size_t chunk = 1 + (size_t)(rand() % 700), used;
        if (chunk > total - off)
            chunk = total - off;
        size_t sub = 0;
        while (sub < chunk) {
            struct ty_rpc_frame f;
            int rc = ty_rpc_decoder_feed(&d, stream + off + sub, chunk - sub, &used, &f);
            sub += used;
            if (rc == 0)
                break;
            assert_int_equal(rc, 1);
            assert_true(f.request_id == 1000 + (uint64_t)got);
            assert_int_equal(f.len, lens[got]);
            for (uint32_t j = 0; j < f.len; j++)
                assert_int_equal(f.payload[j], (uint8_t)(got + j));
            got++;
        }
        off += chunk;
    }
    assert_int_equal(got, N);
    assert_int_equal(ty_rpc_decoder_finish(&d), 0);
    ty_rpc_decoder_fini(&d);
    free(stream);
}

/* protobuf wire format example from the protobuf encoding guide: field 1 = 150 -> 08 96 01. */
static void test_pack_protobuf(void **state)
{
    Tycho__V1__Ping p = TYCHO__V1__PING__INIT;
    p.nonce = 150;
    uint8_t *buf;
    size_t len;
    assert_int_equal(ty_rpc_pack(&p.base, &buf, &len), 0);
    assert_int_equal(len, 3);
    const uint8_t want[] = {0x08, 0x96, 0x01};
    assert_memory_equal(buf, want, 3);
    free(buf);
    Tycho__V1__Ack a = TYCHO__V1__ACK__INIT;
    assert_int_equal(ty_rpc_pack(&a.base, &buf, &len), 0);
    assert_null(buf);
    assert_int_equal(len, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_known_bytes),
        cmocka_unit_test(test_decode_known_bytes),
        cmocka_unit_test(test_decode_split_and_joined),
        cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_bad_version),
        cmocka_unit_test(test_unknown_kind),
        cmocka_unit_test(test_oversized),
        cmocka_unit_test(test_truncated_at_eof),
        cmocka_unit_test(test_random_splits),
        cmocka_unit_test(test_pack_protobuf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
