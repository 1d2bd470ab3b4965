/* TLS server credentials from PEM files and API key entries (tycho/tls.h, tls-impl.h): the
 * parts of OpenSSL the HTTP front door uses, checked the same way by `check-config`, at start
 * and on a SIGHUP reload, so that each names the field at fault in the same words.
 */
#include "tls-impl.h"

#include "tycho/errors.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An encrypted key would make OpenSSL ask on the terminal: refuse instead. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    return -1;
}

/* The oldest error OpenSSL queued (the cause), or `fallback`; the queue is cleared. */
static const char *ssl_reason(char *buf, size_t cap, const char *fallback)
{
    unsigned long e = ERR_peek_error();
    if (e)
        ERR_error_string_n(e, buf, cap);
    else
        snprintf(buf, cap, "%s", fallback);
    ERR_clear_error();
    return buf;
}

/* Open `path` for reading; on failure fill `why`. */
static FILE *open_pem(const char *path, char *why, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        snprintf(why, cap, "cannot read %s: %s", path, strerror(errno));
    return f;
}

/* The certificate (first of the chain) in `path`, or NULL with `why` filled. */
static X509 *read_cert(const char *path, char *why, size_t cap)
{
    FILE *f = open_pem(path, why, cap);
    if (!f)
        return NULL;
    X509 *x = PEM_read_X509(f, NULL, no_passphrase, NULL);
    fclose(f);
    if (!x) {
        ERR_clear_error();
        snprintf(why, cap, "%s is not a PEM certificate", path);
    }
    return x;
}

/* The private key in `path`, or NULL with `why` filled. */
static EVP_PKEY *read_key(const char *path, char *why, size_t cap)
{
    FILE *f = open_pem(path, why, cap);
    if (!f)
        return NULL;
    EVP_PKEY *k = PEM_read_PrivateKey(f, NULL, no_passphrase, NULL);
    fclose(f);
    if (!k) {
        ERR_clear_error();
        snprintf(why, cap,
                 "%s is not a PEM private key (or is one protected by a passphrase, "
                 "which is not supported)",
                 path);
    }
    return k;
}

int ty__tls_server_ctx_new(SSL_CTX **out, const char *cert_path, const char *key_path,
                           const char **field, char *why, size_t cap)
{
    char reason[256];
    *out = NULL;
    *field = "tls_cert";
    X509 *x = read_cert(cert_path, why, cap);
    if (!x)
        return TY_ECONFIG;
    X509_free(x); /* read once for a clear message; the context loads the whole chain */
    *field = "tls_key";
    EVP_PKEY *k = read_key(key_path, why, cap);
    if (!k)
        return TY_ECONFIG;
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        EVP_PKEY_free(k);
        ERR_clear_error();
        return TY_ENOMEM;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS); /* idle keep-alive connections stay small */
    int rc = TY_ECONFIG;
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_path) != 1) {
        *field = "tls_cert";
        snprintf(why, cap, "cannot load the certificate chain in %s: %s", cert_path,
                 ssl_reason(reason, sizeof(reason), "unknown error"));
    } else if (SSL_CTX_use_PrivateKey(ctx, k) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        snprintf(why, cap, "the key in %s does not match the certificate in %s", key_path,
                 cert_path);
    } else {
        rc = 0;
    }
    EVP_PKEY_free(k);
    if (rc) {
        SSL_CTX_free(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

int ty_tls_check_pair(const char *cert_path, const char *key_path, const char **field, char *why,
                      size_t cap)
{
    SSL_CTX *ctx;
    int rc = ty__tls_server_ctx_new(&ctx, cert_path, key_path, field, why, cap);
    SSL_CTX_free(ctx);
    return rc == TY_ENOMEM ? TY_ECONFIG : rc;
}

/* ---- API keys ----------------------------------------------------------------------------- */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int ty_apikey_parse(const char *entry, struct ty_apikey *k, char *why, size_t cap)
{
    const size_t plen = sizeof(TY_APIKEY_HASH_PREFIX) - 1;
    memset(k, 0, sizeof(*k));
    if (strncmp(entry, TY_APIKEY_HASH_PREFIX, plen) != 0) {
        ty_apikey_digest(entry, strlen(entry), k->sha256);
        k->valid = true;
        return 0;
    }
    const char *h = entry + plen;
    bool good = strlen(h) == 64;
    for (size_t i = 0; good && i < 32; i++) {
        int hi = hexval(h[2 * i]), lo = hexval(h[2 * i + 1]);
        good = hi >= 0 && lo >= 0;
        k->sha256[i] = (uint8_t)(hi << 4 | lo);
    }
    if (!good) {
        snprintf(why, cap,
                 "a '" TY_APIKEY_HASH_PREFIX "' entry needs the 64 hex digits of a "
                 "SHA-256 (printf %%s \"$KEY\" | sha256sum)");
        memset(k, 0, sizeof(*k));
        return TY_EINVAL;
    }
    k->hashed = k->valid = true;
    return 0;
}

void ty_apikey_digest(const void *data, size_t n, uint8_t out[32])
{
    unsigned int len = 32;
    if (EVP_Digest(data, n, out, &len, EVP_sha256(), NULL) != 1)
        abort(); /* SHA-256 of a few bytes fails only without memory (STYLE.md: abort) */
}

bool ty_apikey_match(const struct ty_apikey *k, const uint8_t token_sha256[32])
{
    return k->valid & (CRYPTO_memcmp(k->sha256, token_sha256, 32) == 0);
}
