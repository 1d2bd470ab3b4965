/* Cluster authentication (tycho/auth.h): the secret file, and the challenge-response handshake
 * as a pure state machine plus its blocking-socket driver. */
#include "tycho/auth.h"

#include "tycho/errors.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAGIC "TYAU"
#define VERSION 1

enum msg_type { MSG_CHALLENGE = 1, MSG_RESPONSE = 2, MSG_ACCEPT = 3, MSG_REJECT = 4 };

#define FLAG_INSECURE 1u

/* Wire layout (72 bytes): magic[4] version[1] type[1] flags[1] reason[1] nonce[32] mac[32]. */
#define OFF_NONCE 8
#define OFF_MAC   40

static _Atomic uint64_t failures;

void ty_auth_count_failure(void)
{
    atomic_fetch_add_explicit(&failures, 1, memory_order_relaxed);
}

uint64_t ty_auth_failures(void)
{
    return atomic_load_explicit(&failures, memory_order_relaxed);
}

/* ---- the secret ------------------------------------------------------------------------------ */

static int load_fail(char *err, size_t cap, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int load_fail(char *err, size_t cap, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && cap)
        vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return rc;
}

int ty_auth_load(struct ty_auth *out, const struct ty_auth_config *cfg, char *err, size_t cap)
{
    memset(out, 0, sizeof(*out));
    const char *path = cfg->secret_file;
    if (!path || !*path) {
        if (cfg->insecure) {
            out->insecure = true;
            snprintf(out->source, sizeof(out->source), "insecure");
            return 0;
        }
        return load_fail(err, cap, TY_ECONFIG,
                         "cluster_secret_file: not set; every cluster port needs a secret "
                         "(or set insecure: true to serve anyone who reaches the ports)");
    }
    if (cfg->insecure)
        return load_fail(err, cap, TY_ECONFIG,
                         "insecure: true and cluster_secret_file '%s' are both set; choose one",
                         path);
    int fd = open(path, O_RDONLY | O_CLOEXEC); /* a symlink is fine (Kubernetes secrets) */
    if (fd < 0) {
        if (err && cap)
            snprintf(err, cap, "cluster_secret_file: cannot open '%s': %s", path,
                     strerror(errno));
        return TY_ECONFIG;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return load_fail(err, cap, TY_ECONFIG, "cluster_secret_file: '%s' is not a regular file",
                         path);
    }
    if (st.st_mode & 0007) {
        close(fd);
        if (err && cap)
            snprintf(err, cap,
                     "cluster_secret_file: '%s' is accessible by every user (mode %04o); "
                     "chmod 600 it",
                     path, (unsigned)(st.st_mode & 07777));
        return TY_EACCES;
    }
    uint8_t extra;
    ssize_t n = read(fd, out->key, sizeof(out->key));
    bool longer = n == (ssize_t)sizeof(out->key) && read(fd, &extra, 1) == 1;
    close(fd);
    if (n < 0)
        return load_fail(err, cap, TY_ECONFIG, "cluster_secret_file: cannot read '%s'", path);
    if (longer) {
        memset(out->key, 0, sizeof(out->key));
        return load_fail(err, cap, TY_ECONFIG,
                         "cluster_secret_file: '%s' is longer than %d bytes (a secret, not a "
                         "key store: `tycho gen-secret` makes 64 characters)",
                         path, TY_AUTH_KEY_MAX);
    }
    while (n > 0 && (out->key[n - 1] == '\n' || out->key[n - 1] == '\r' ||
                     out->key[n - 1] == ' ' || out->key[n - 1] == '\t'))
        n--;
    if (n < TY_AUTH_SECRET_MIN) {
        memset(out->key, 0, sizeof(out->key));
        if (err && cap)
            snprintf(err, cap,
                     "cluster_secret_file: '%s' holds %zd bytes; a secret needs at least %d "
                     "(make one with `tycho gen-secret FILE`)",
                     path, n, TY_AUTH_SECRET_MIN);
        return TY_ECONFIG;
    }
    out->key_len = (size_t)n;
    snprintf(out->source, sizeof(out->source), "%s", path);
    return 0;
}

static struct ty_auth env_auth;
static const struct ty_auth *env_auth_ptr;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void env_load(void)
{
    struct ty_auth_config cfg = {.secret_file = getenv("TYCHO_CLUSTER_SECRET_FILE")};
    if (!cfg.secret_file || !*cfg.secret_file)
        return;
    char err[512];
    if (ty_auth_load(&env_auth, &cfg, err, sizeof(err)) == 0)
        env_auth_ptr = &env_auth;
    else
        fprintf(stderr, "TYCHO_CLUSTER_SECRET_FILE: %s\n", err);
}

const struct ty_auth *ty_auth_from_env(void)
{
    pthread_once(&env_once, env_load);
    return env_auth_ptr;
}

int ty_auth_secret_create(const char *path)
{
    uint8_t raw[32];
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw))
        return ty_errno();
    char hex[sizeof(raw) * 2 + 2];
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    hex[sizeof(raw) * 2] = '\n';
    hex[sizeof(raw) * 2 + 1] = '\0';
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return ty_errno();
    size_t len = strlen(hex);
    ssize_t w = write(fd, hex, len);
    int rc = (w == (ssize_t)len && fsync(fd) == 0) ? 0 : TY_EIO;
    close(fd);
    OPENSSL_cleanse(raw, sizeof(raw));
    OPENSSL_cleanse(hex, sizeof(hex));
    return rc;
}

/* ---- handshake ------------------------------------------------------------------------------ */

static bool secured(const struct ty_auth_hs *hs)
{
    return hs->auth && !hs->auth->insecure && hs->auth->key_len > 0;
}

/* HMAC(K, label | a | b) */
static void mac(const struct ty_auth *a, const char *label, const uint8_t *x, const uint8_t *y,
                uint8_t out[TY_AUTH_MAC_SIZE])
{
    uint8_t buf[32 + 2 * TY_AUTH_NONCE_SIZE];
    size_t ll = strlen(label);
    memcpy(buf, label, ll);
    memcpy(buf + ll, x, TY_AUTH_NONCE_SIZE);
    memcpy(buf + ll + TY_AUTH_NONCE_SIZE, y, TY_AUTH_NONCE_SIZE);
    unsigned int n = TY_AUTH_MAC_SIZE;
    if (!HMAC(EVP_sha256(), a->key, (int)a->key_len, buf, ll + 2 * TY_AUTH_NONCE_SIZE, out, &n))
        memset(out, 0, TY_AUTH_MAC_SIZE); /* never matches a real proof */
}

static void put_msg(struct ty_auth_hs *hs, enum msg_type type, uint8_t reason, const uint8_t *nonce,
                    const uint8_t *m)
{
    uint8_t *o = hs->out;
    memset(o, 0, TY_AUTH_MSG_SIZE);
    memcpy(o, MAGIC, 4);
    o[4] = VERSION;
    o[5] = (uint8_t)type;
    o[6] = secured(hs) ? 0 : FLAG_INSECURE;
    o[7] = reason;
    if (nonce)
        memcpy(o + OFF_NONCE, nonce, TY_AUTH_NONCE_SIZE);
    if (m)
        memcpy(o + OFF_MAC, m, TY_AUTH_MAC_SIZE);
    hs->out_len = TY_AUTH_MSG_SIZE;
}

void ty_auth_hs_init(struct ty_auth_hs *hs, const struct ty_auth *auth, bool server)
{
    memset(hs, 0, sizeof(*hs));
    hs->auth = auth;
    hs->server = server;
    if (getrandom(hs->my_nonce, sizeof(hs->my_nonce), 0) != (ssize_t)sizeof(hs->my_nonce)) {
        /* no entropy: a handshake that cannot succeed is better than a predictable nonce */
        hs->state = TY_AUTH_HS_FAILED;
        snprintf(hs->why, sizeof(hs->why), "no random bytes for a nonce");
        return;
    }
    if (server)
        put_msg(hs, MSG_CHALLENGE, 0, hs->my_nonce, NULL);
}

enum reject_reason { REJ_NONE = 0, REJ_BAD_PROOF = 1, REJ_INSECURE_PEER = 2, REJ_NEED_SECRET = 3 };

static const char *reject_text(uint8_t r)
{
    switch (r) {
    case REJ_BAD_PROOF: return "the peer refused our proof: a different cluster secret";
    case REJ_INSECURE_PEER: return "the peer refuses insecure processes: set cluster_secret_file";
    case REJ_NEED_SECRET: return "the peer runs insecure and refuses our secured connection";
    default: return "the peer refused the handshake";
    }
}

static int fail(struct ty_auth_hs *hs, uint8_t reject, const char *why)
{
    hs->state = TY_AUTH_HS_FAILED;
    snprintf(hs->why, sizeof(hs->why), "%s", why);
    hs->out_len = 0;
    if (reject)
        put_msg(hs, MSG_REJECT, reject, NULL, NULL);
    return TY_AUTH_HS_FAILED;
}

/* One whole message from the peer, checked. */
static int on_msg(struct ty_auth_hs *hs, const uint8_t *m)
{
    if (memcmp(m, MAGIC, 4) != 0)
        return fail(hs, 0, "not a tycho cluster handshake (an old or foreign peer?)");
    if (m[4] != VERSION)
        return fail(hs, 0, "unsupported handshake version");
    uint8_t type = m[5];
    bool peer_insecure = (m[6] & FLAG_INSECURE) != 0;
    if (type == MSG_REJECT) {
        hs->rejected_by_peer = true;
        return fail(hs, 0, reject_text(m[7]));
    }
    bool sec = secured(hs);
    uint8_t proof[TY_AUTH_MAC_SIZE];
    if (!hs->server && hs->step == 0 && type == MSG_CHALLENGE) {
        if (sec && peer_insecure)
            return fail(hs, 0, "the peer runs insecure (no cluster secret); refusing it");
        if (!sec && !peer_insecure)
            return fail(hs, 0, "the peer requires the cluster secret; set cluster_secret_file");
        memcpy(hs->peer_nonce, m + OFF_NONCE, TY_AUTH_NONCE_SIZE);
        if (sec)
            mac(hs->auth, "tycho-auth-1 client", hs->peer_nonce, hs->my_nonce, proof);
        put_msg(hs, MSG_RESPONSE, 0, hs->my_nonce, sec ? proof : NULL);
        hs->step = 1;
        return TY_AUTH_HS_WAIT;
    }
    if (hs->server && hs->step == 0 && type == MSG_RESPONSE) {
        if (sec && peer_insecure)
            return fail(hs, REJ_INSECURE_PEER, "the peer has no cluster secret (insecure)");
        if (!sec && !peer_insecure)
            return fail(hs, REJ_NEED_SECRET, "a secured peer reached this insecure process");
        memcpy(hs->peer_nonce, m + OFF_NONCE, TY_AUTH_NONCE_SIZE);
        if (sec) {
            mac(hs->auth, "tycho-auth-1 client", hs->my_nonce, hs->peer_nonce, proof);
            if (CRYPTO_memcmp(proof, m + OFF_MAC, TY_AUTH_MAC_SIZE) != 0)
                return fail(hs, REJ_BAD_PROOF, "wrong cluster secret");
            mac(hs->auth, "tycho-auth-1 server", hs->peer_nonce, hs->my_nonce, proof);
        }
        put_msg(hs, MSG_ACCEPT, 0, NULL, sec ? proof : NULL);
        hs->step = 1;
        hs->state = TY_AUTH_HS_DONE;
        return TY_AUTH_HS_DONE;
    }
    if (!hs->server && hs->step == 1 && type == MSG_ACCEPT) {
        if (sec) {
            mac(hs->auth, "tycho-auth-1 server", hs->my_nonce, hs->peer_nonce, proof);
            if (CRYPTO_memcmp(proof, m + OFF_MAC, TY_AUTH_MAC_SIZE) != 0)
                return fail(hs, 0, "the peer does not know the cluster secret (bad proof)");
        }
        hs->step = 2;
        hs->state = TY_AUTH_HS_DONE;
        return TY_AUTH_HS_DONE;
    }
    return fail(hs, 0, "handshake message out of order");
}

int ty_auth_hs_feed(struct ty_auth_hs *hs, const uint8_t *data, size_t len, size_t *consumed)
{
    size_t used = 0;
    int rc = hs->state;
    while (hs->state == TY_AUTH_HS_WAIT && used < len) {
        size_t take = TY_AUTH_MSG_SIZE - hs->in_have;
        if (take > len - used)
            take = len - used;
        memcpy(hs->in + hs->in_have, data + used, take);
        hs->in_have += take;
        used += take;
        /* a foreign protocol is told apart at its first bytes, not after 72 of them */
        if (hs->in_have >= 4 && memcmp(hs->in, MAGIC, 4) != 0) {
            rc = fail(hs, 0, "not a tycho cluster handshake (an old or foreign peer?)");
            break;
        }
        if (hs->in_have < TY_AUTH_MSG_SIZE)
            break;
        hs->in_have = 0;
        rc = on_msg(hs, hs->in);
    }
    if (consumed)
        *consumed = used;
    return rc == TY_AUTH_HS_WAIT ? (int)hs->state : rc;
}

/* ---- blocking driver ------------------------------------------------------------------------ */

static int send_out(int fd, struct ty_auth_hs *hs)
{
    size_t off = 0;
    while (off < hs->out_len) {
        ssize_t n = send(fd, hs->out + off, hs->out_len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? ty_errno() : TY_ECONNRESET;
        off += (size_t)n;
    }
    hs->out_len = 0;
    return 0;
}

int ty_auth_handshake_fd(int fd, const struct ty_auth *auth, bool server, uint32_t timeout_ms,
                         char *why, size_t cap)
{
    struct ty_auth_hs hs;
    ty_auth_hs_init(&hs, auth, server);
    int rc = 0;
    /* one deadline for the whole exchange: a peer dribbling a byte at a time gains nothing */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int64_t limit_ms = timeout_ms ? timeout_ms : TY_AUTH_TIMEOUT_MS;
    while (hs.state == TY_AUTH_HS_WAIT) {
        if ((rc = send_out(fd, &hs)) != 0)
            goto out;
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        int64_t left = limit_ms - ((t.tv_sec - t0.tv_sec) * 1000 +
                                   (t.tv_nsec - t0.tv_nsec) / 1000000);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = left > 0 ? poll(&p, 1, (int)left) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0) {
            rc = TY_ETIMEDOUT;
            snprintf(hs.why, sizeof(hs.why), "the peer did not finish the handshake in time");
            goto out;
        }
        /* exactly what the handshake still needs: the protocol's bytes after it stay queued */
        uint8_t buf[TY_AUTH_MSG_SIZE];
        ssize_t n = recv(fd, buf, TY_AUTH_MSG_SIZE - hs.in_have, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = n < 0 ? ty_errno() : TY_ECONNRESET;
            snprintf(hs.why, sizeof(hs.why), "the peer closed during the handshake");
            goto out;
        }
        ty_auth_hs_feed(&hs, buf, (size_t)n, NULL);
    }
    (void)send_out(fd, &hs); /* the ACCEPT, or a REJECT before the caller closes */
    if (hs.state == TY_AUTH_HS_FAILED)
        rc = TY_EACCES;
out:
    if (rc)
        ty_auth_count_failure();
    if (why && cap)
        snprintf(why, cap, "%s", rc ? hs.why : "");
    return rc;
}
