/* libFuzzer: the header and hello decoders take bytes from the network. */
#include "xfer-impl.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ty__xfer_hdr h;
    if (size >= TY__XFER_HDR_SIZE)
        ty__xfer_hdr_decode(data, &h);
    struct ty__xfer_hello hello;
    if (ty__xfer_hello_decode(data, size, &hello) == 0)
        ty__xfer_hello_clear(&hello);
    return 0;
}
