/* libFuzzer: the decoders that take bytes from the network. Every input goes to the header
 * decoder (first 64 bytes), the hello body decoder and the RDMA connect decoder; whatever one
 * accepts must encode back to the same bytes (the formats have one encoding per value). */
#include "xfer-impl.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ty__xfer_hdr h;
    if (size >= TY__XFER_HDR_SIZE)
        ty__xfer_hdr_decode(data, &h);
    struct ty__xfer_hello hello;
    if (ty__xfer_hello_decode(data, size, &hello) == 0) {
        uint8_t *buf;
        size_t len;
        ty__xfer_hello_encode(&hello, &buf, &len);
        if (len != size || memcmp(buf, data, size) != 0)
            abort();
        free(buf);
        ty__xfer_hello_clear(&hello);
    }
    struct ty__xfer_rdma_connect c;
    if (ty__xfer_rdma_connect_decode(data, size, &c) == 0) {
        uint8_t out[1 + 32 * TY__XFER_RDMA_MAX_LANES];
        size_t len = ty__xfer_rdma_connect_encode(&c, out, sizeof(out));
        if (len != size || memcmp(out, data, size) != 0)
            abort();
    }
    return 0;
}
