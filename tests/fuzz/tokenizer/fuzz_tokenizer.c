/* libFuzzer target: the tokenizer.json loader, then the encoder and decoder of whatever
 * loaded. Input: a tokenizer.json text, optionally followed by "\n\x00" and text to encode. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem; the build defines it already */
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tycho/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *d = (const char *)data;
    const char *sep = memmem(d, size, "\n\0", 2);
    size_t jl = sep ? (size_t)(sep - d) : size;
    const char *text = sep ? sep + 2 : "Hello, world! \xf0\x9f\x9a\x80 <s>";
    size_t tl = sep ? size - jl - 2 : strlen(text);
    ty_tokenizer_t *tok;
    char eb[256];
    if (ty_tokenizer_load_json_buf(&tok, d, jl, eb, sizeof(eb)) != 0)
        return 0;
    uint32_t ids[512];
    for (int ps = 0; ps < 2; ps++) {
        int n = ty_tokenizer_encode(tok, text, tl, ps, ps, ids, 512);
        if (n > 0) {
            char out[4096];
            size_t k = n < 512 ? (size_t)n : 512;
            ty_tokenizer_decode(tok, ids, k, ps, out, sizeof(out));
            struct ty_detok dt;
            ty_detok_init(&dt, tok);
            for (size_t i = 0; i < k; i++)
                ty_detok_feed(&dt, ids[i], out, sizeof(out));
            ty_detok_flush(&dt, out, sizeof(out));
        }
    }
    ty_tokenizer_free(tok);
    return 0;
}
