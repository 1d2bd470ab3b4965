/* TLS server credentials and API key entries: what the HTTP front door (tycho/http.h) needs
 * from OpenSSL, kept here so that config checks can use it without a server.
 *
 * Threading: every function is pure or reads files only; any thread. Ownership: nothing is
 * kept; callers own the strings they pass and the buffers they fill.
 */
#ifndef TYCHO_TLS_H
#define TYCHO_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Check that `cert_path` holds a PEM certificate (chain) and `key_path` a PEM private key of
 * that certificate, as the HTTP server would load them. Returns 0, or TY_ECONFIG with *field
 * set to "tls_cert" or "tls_key" (the one at fault) and `why` (cap bytes) saying what is wrong
 * ("cannot read ...: No such file or directory", "not a PEM certificate", "the key does not
 * match the certificate"). */
int ty_tls_check_pair(const char *cert_path, const char *key_path, const char **field, char *why,
                      size_t cap);

/* ---- API keys -------------------------------------------------------------------------------
 * An entry of `api_keys` is either the bearer token itself or "sha256:" and the 64 hex digits
 * of the SHA-256 of the token (`printf %s "$KEY" | sha256sum`), so that a config file need not
 * hold the secret. Both kinds are kept as a digest and a token is matched by its own digest
 * (CRYPTO_memcmp): the time taken says nothing about how much of a key a token got right. */
#define TY_APIKEY_HASH_PREFIX "sha256:"

struct ty_apikey {
    uint8_t sha256[32]; /* the digest a matching token has */
    bool hashed;        /* the entry was "sha256:..." */
    bool valid;         /* parsed; an entry that did not parse matches nothing */
};

/* Parse one entry into *k. Returns 0, or TY_EINVAL for a "sha256:" entry not followed by
 * exactly 64 hex digits (`why`, cap bytes, says so). */
int ty_apikey_parse(const char *entry, struct ty_apikey *k, char *why, size_t cap);

/* out = SHA-256(data[0..n)). */
void ty_apikey_digest(const void *data, size_t n, uint8_t out[32]);

/* Whether a token whose digest (ty_apikey_digest) is `token_sha256` matches k (never when k is
 * not valid), in constant time. */
bool ty_apikey_match(const struct ty_apikey *k, const uint8_t token_sha256[32]);

#endif
