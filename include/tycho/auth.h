/* Cluster authentication: every RPC, transfer and store connection proves that both ends know
 * the cluster secret before a byte of its protocol flows (docs/arch/security.md).
 *
 * The proof is a challenge-response over nonces from both sides, HMAC-SHA256 keyed with the
 * secret; the secret never crosses the wire and a recorded exchange replays nowhere (each side
 * picks a fresh nonce). Three fixed-size messages, the accepting side first:
 *     server -> client  CHALLENGE  nonce_s
 *     client -> server  RESPONSE   nonce_c, HMAC(K, "tycho-auth-1 client" | nonce_s | nonce_c)
 *     server -> client  ACCEPT     HMAC(K, "tycho-auth-1 server" | nonce_c | nonce_s)
 *                    or REJECT     (and the server closes)
 * so each end knows the other holds the secret (a fake Conductor learns no prompt). A process
 * started `insecure` runs the same exchange with no key and a flag saying so; a secured end
 * refuses it, so a mixed cluster fails loudly at connect time instead of half working.
 *
 * The handshake is a pure state machine (no sockets; fuzzed) driven by the libuv RPC connection
 * and by the transfer engine's blocking sockets (ty_auth_handshake_fd). A struct ty_auth is
 * immutable once loaded and may be shared by every thread.
 */
#ifndef TYCHO_AUTH_H
#define TYCHO_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TY_AUTH_MSG_SIZE    72 /* every handshake message */
#define TY_AUTH_NONCE_SIZE  32
#define TY_AUTH_MAC_SIZE    32
#define TY_AUTH_KEY_MAX     512 /* bytes of secret used */
#define TY_AUTH_SECRET_MIN  16  /* a shorter secret is refused */
#define TY_AUTH_TIMEOUT_MS  5000 /* a peer that has not proved itself by then is dropped */

/* The process's credential: the secret's bytes, or none (insecure). */
struct ty_auth {
    bool insecure;
    size_t key_len;
    uint8_t key[TY_AUTH_KEY_MAX];
    char source[256]; /* the file it came from, for log lines */
};

/* The daemon config rows (every daemon with a cluster port has them at its root). */
struct ty_auth_config {
    char *secret_file;
    bool insecure;
};

#define TY_AUTH_CONFIG_ROWS(T, P)                                                                 \
    {.key = "cluster_secret_file", .type = TY_CONFIG_STRING, TY_CONFIG_AT(T, P secret_file),      \
     .min = "1",                                                                                  \
     .help = "file with the cluster secret (mode 0600, at least 16 bytes) every RPC, transfer "   \
             "and store connection must prove it knows"},                                         \
    {.key = "insecure", .type = TY_CONFIG_BOOL, TY_CONFIG_AT(T, P insecure), .def = "false",      \
     .help = "run without a cluster secret: whoever reaches the cluster ports is served"}

/* Read the secret named by `cfg` into `out` (an insecure config gives an insecure credential).
 * Refuses, with a message naming the field in `err`: no file and not insecure, both set, a file
 * that is missing, not a regular file, accessible by other users (mode & 0007), or shorter than
 * TY_AUTH_SECRET_MIN bytes after trailing whitespace. Returns 0, TY_ECONFIG or TY_EACCES. */
int ty_auth_load(struct ty_auth *out, const struct ty_auth_config *cfg, char *err, size_t cap);

/* The credential named by $TYCHO_CLUSTER_SECRET_FILE (what the daemons read too), loaded once
 * per process, for tools and tests that talk to a cluster's ports; NULL (insecure) when the
 * variable is unset. A file that fails ty_auth_load's checks is reported on stderr once and also
 * gives NULL, so the peer refuses the connection with a clear reason. Any thread. */
const struct ty_auth *ty_auth_from_env(void);

/* Write a fresh random secret (64 hex characters) to `path` with mode 0600, failing with
 * TY_EEXIST when the file exists. For first starts (scripts, `tycho gen-secret`). */
int ty_auth_secret_create(const char *path);

/* Process-wide count of handshakes that failed (any port, either side): the daemons export it as
 * tycho_auth_failures_total. Any thread. */
void ty_auth_count_failure(void);
uint64_t ty_auth_failures(void);

/* ---- handshake state machine --------------------------------------------------------------- */

enum ty_auth_hs_state {
    TY_AUTH_HS_WAIT = 0, /* waiting for the peer's next message */
    TY_AUTH_HS_DONE = 1, /* proved both ways */
    TY_AUTH_HS_FAILED = 2,
};

struct ty_auth_hs {
    const struct ty_auth *auth; /* borrowed; NULL acts as insecure */
    bool server;
    int step; /* messages received so far */
    enum ty_auth_hs_state state;
    uint8_t my_nonce[TY_AUTH_NONCE_SIZE];
    uint8_t peer_nonce[TY_AUTH_NONCE_SIZE];
    uint8_t in[TY_AUTH_MSG_SIZE];
    size_t in_have;
    uint8_t out[TY_AUTH_MSG_SIZE]; /* a message to send (out_len bytes), set by init/feed */
    size_t out_len;
    bool rejected_by_peer;
    char why[160]; /* the reason of a failure, for the log line */
};

/* Start a handshake. The server side has its CHALLENGE in out/out_len at once. */
void ty_auth_hs_init(struct ty_auth_hs *hs, const struct ty_auth *auth, bool server);

/* Consume peer bytes. Returns TY_AUTH_HS_WAIT (need more; send out[0..out_len) if out_len),
 * TY_AUTH_HS_DONE (send what is in out, then the connection is authenticated; bytes after the
 * handshake are not consumed: *consumed says how many were) or TY_AUTH_HS_FAILED (why says;
 * send out if out_len — a REJECT — then close). The caller clears out_len once sent. */
int ty_auth_hs_feed(struct ty_auth_hs *hs, const uint8_t *data, size_t len, size_t *consumed);

/* Run the whole handshake on a blocking socket, each read bounded by timeout_ms. Returns 0 or
 * TY_EACCES (refused; `why` says), TY_ETIMEDOUT, TY_ECONNRESET or another socket error. */
int ty_auth_handshake_fd(int fd, const struct ty_auth *auth, bool server, uint32_t timeout_ms,
                         char *why, size_t cap);

#endif
