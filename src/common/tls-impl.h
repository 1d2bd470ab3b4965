/* What the HTTP server (http.c) takes from tls.c: a server SSL_CTX built from PEM files, with
 * the same checks and messages as ty_tls_check_pair (tycho/tls.h). Any thread.
 */
#ifndef TYCHO_TLS_IMPL_H
#define TYCHO_TLS_IMPL_H

#include "tycho/tls.h"

#include <openssl/ssl.h>

/* *out: a new server context (TLS 1.2 and up) holding cert_path's chain and key_path's key;
 * free with SSL_CTX_free. Returns 0, TY_ENOMEM, or TY_ECONFIG with *field and `why` filled. */
int ty__tls_server_ctx_new(SSL_CTX **out, const char *cert_path, const char *key_path,
                           const char **field, char *why, size_t cap);

#endif
