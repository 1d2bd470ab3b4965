/* Helpers shared by the tokenizer tests: test data paths and JSON-lines reading. */
#ifndef TYCHO_TOK_TEST_UTIL_H
#define TYCHO_TOK_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>

/* $TYCHO_TEST_DATA/rel into buf; exits 77 (skip) when the file is missing. */
static inline const char *tok_test_path(char *buf, size_t cap, const char *rel)
{
    const char *d = getenv("TYCHO_TEST_DATA");
    snprintf(buf, cap, "%s/%s", d ? d : "../shared", rel);
    FILE *f = fopen(buf, "rb");
    if (!f) {
        fprintf(stderr, "skip: %s missing\n", buf);
        exit(77);
    }
    fclose(f);
    return buf;
}

#endif
