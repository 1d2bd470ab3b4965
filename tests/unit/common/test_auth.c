/* Cluster authentication: the handshake state machine between two in-memory ends, and the
 * secret file checks an operator meets at start-up. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/auth.h"
#include "tycho/config.h"
#include "tycho/errors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct ty_auth secret(const char *s)
{
    struct ty_auth a = {0};
    a.key_len = strlen(s);
    memcpy(a.key, s, a.key_len);
    return a;
}

/* Pass messages between the two ends until neither has one to send; returns the states. */
static void run(struct ty_auth_hs *srv, struct ty_auth_hs *cli)
{
    for (int round = 0; round < 8; round++) {
        bool moved = false;
        if (srv->out_len) {
            uint8_t m[TY_AUTH_MSG_SIZE];
            memcpy(m, srv->out, srv->out_len);
            size_t n = srv->out_len, used = 0;
            srv->out_len = 0;
            if (cli->state == TY_AUTH_HS_WAIT) {
                ty_auth_hs_feed(cli, m, n, &used);
                moved = true;
            }
        }
        if (cli->out_len) {
            uint8_t m[TY_AUTH_MSG_SIZE];
            memcpy(m, cli->out, cli->out_len);
            size_t n = cli->out_len, used = 0;
            cli->out_len = 0;
            if (srv->state == TY_AUTH_HS_WAIT) {
                /* byte by byte: a stream may cut messages anywhere */
                for (size_t i = 0; i < n; i++)
                    ty_auth_hs_feed(srv, m + i, 1, &used);
                moved = true;
            }
        }
        if (!moved)
            return;
    }
}

static void test_same_secret_proves_both_ways(void **state)
{
    (void)state;
    struct ty_auth k = secret("0123456789abcdef0123456789abcdef");
    struct ty_auth_hs s, c;
    ty_auth_hs_init(&s, &k, true);
    ty_auth_hs_init(&c, &k, false);
    run(&s, &c);
    assert_int_equal(s.state, TY_AUTH_HS_DONE);
    assert_int_equal(c.state, TY_AUTH_HS_DONE);
}

static void test_wrong_secret_refused_and_told(void **state)
{
    (void)state;
    struct ty_auth k1 = secret("0123456789abcdef0123456789abcdef");
    struct ty_auth k2 = secret("0123456789abcdef0123456789abcdeX");
    struct ty_auth_hs s, c;
    ty_auth_hs_init(&s, &k1, true);
    ty_auth_hs_init(&c, &k2, false);
    run(&s, &c);
    assert_int_equal(s.state, TY_AUTH_HS_FAILED);
    assert_non_null(strstr(s.why, "wrong cluster secret"));
    assert_int_equal(c.state, TY_AUTH_HS_FAILED);
    assert_true(c.rejected_by_peer);
    assert_non_null(strstr(c.why, "different cluster secret"));
}

static void test_insecure_and_secure_never_pair(void **state)
{
    (void)state;
    struct ty_auth k = secret("0123456789abcdef0123456789abcdef");
    struct ty_auth none = {.insecure = true};
    struct ty_auth_hs s, c;
    /* secured server, insecure client: the client knows at once what to fix */
    ty_auth_hs_init(&s, &k, true);
    ty_auth_hs_init(&c, &none, false);
    run(&s, &c);
    assert_int_equal(c.state, TY_AUTH_HS_FAILED);
    assert_non_null(strstr(c.why, "cluster_secret_file"));
    assert_int_not_equal(s.state, TY_AUTH_HS_DONE);
    /* insecure server, secured client: the client refuses to talk to it */
    ty_auth_hs_init(&s, NULL, true);
    ty_auth_hs_init(&c, &k, false);
    run(&s, &c);
    assert_int_equal(c.state, TY_AUTH_HS_FAILED);
    assert_non_null(strstr(c.why, "insecure"));
    assert_int_not_equal(s.state, TY_AUTH_HS_DONE);
    /* both insecure: served (the operator said so) */
    ty_auth_hs_init(&s, &none, true);
    ty_auth_hs_init(&c, NULL, false);
    run(&s, &c);
    assert_int_equal(s.state, TY_AUTH_HS_DONE);
    assert_int_equal(c.state, TY_AUTH_HS_DONE);
}

static void test_replayed_response_fails(void **state)
{
    (void)state;
    struct ty_auth k = secret("0123456789abcdef0123456789abcdef");
    struct ty_auth_hs s1, c1, s2;
    ty_auth_hs_init(&s1, &k, true);
    ty_auth_hs_init(&c1, &k, false);
    size_t used;
    ty_auth_hs_feed(&c1, s1.out, s1.out_len, &used);
    uint8_t recorded[TY_AUTH_MSG_SIZE];
    memcpy(recorded, c1.out, sizeof(recorded));
    /* a second server picks a new nonce: the recorded proof is for another challenge */
    ty_auth_hs_init(&s2, &k, true);
    assert_int_equal(ty_auth_hs_feed(&s2, recorded, sizeof(recorded), &used), TY_AUTH_HS_FAILED);
    assert_non_null(strstr(s2.why, "wrong cluster secret"));
}

static void test_foreign_bytes_fail_fast(void **state)
{
    (void)state;
    struct ty_auth_hs s;
    ty_auth_hs_init(&s, NULL, true);
    size_t used;
    const char http[] = "GET / HTTP/1.1\r\n";
    assert_int_equal(ty_auth_hs_feed(&s, (const uint8_t *)http, 4, &used), TY_AUTH_HS_FAILED);
    assert_non_null(strstr(s.why, "not a tycho cluster handshake"));
}

static void test_bytes_after_handshake_left_for_protocol(void **state)
{
    (void)state;
    struct ty_auth k = secret("0123456789abcdef0123456789abcdef");
    struct ty_auth_hs s, c;
    ty_auth_hs_init(&s, &k, true);
    ty_auth_hs_init(&c, &k, false);
    size_t used;
    ty_auth_hs_feed(&c, s.out, s.out_len, &used);
    uint8_t buf[TY_AUTH_MSG_SIZE + 5];
    memcpy(buf, c.out, TY_AUTH_MSG_SIZE);
    memcpy(buf + TY_AUTH_MSG_SIZE, "TYRP!", 5);
    assert_int_equal(ty_auth_hs_feed(&s, buf, sizeof(buf), &used), TY_AUTH_HS_DONE);
    assert_int_equal(used, TY_AUTH_MSG_SIZE);
}

static void test_blocking_sockets(void **state)
{
    (void)state;
    struct ty_auth k = secret("0123456789abcdef0123456789abcdef");
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = ty_auth_handshake_fd(sv[1], &k, false, 2000, NULL, 0);
        _exit(rc == 0 ? 0 : 1);
    }
    char why[160];
    assert_int_equal(ty_auth_handshake_fd(sv[0], &k, true, 2000, why, sizeof(why)), 0);
    int st;
    waitpid(pid, &st, 0);
    assert_int_equal(WEXITSTATUS(st), 0);
    close(sv[0]);
    close(sv[1]);
    /* a peer that says nothing: the server gives up at the timeout */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(ty_auth_handshake_fd(sv[0], &k, true, 200, why, sizeof(why)),
                     TY_ETIMEDOUT);
    close(sv[0]);
    close(sv[1]);
}

/* A peer that dribbles a byte every 100 ms gains nothing: the deadline is the whole exchange's. */
static void test_one_deadline_for_the_exchange(void **state)
{
    (void)state;
    struct ty_auth k = secret("0123456789abcdef0123456789abcdef");
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_t pid = fork();
    if (pid == 0) {
        const char *msg = "TYAU\x01\x02"; /* a RESPONSE's start, then nothing but zeros */
        for (int i = 0; i < 40; i++) {
            if (write(sv[1], i < 6 ? msg + i : "", 1) != 1)
                break;
            usleep(100 * 1000);
        }
        _exit(0);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char why[160];
    int rc = ty_auth_handshake_fd(sv[0], &k, true, 500, why, sizeof(why));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_int_not_equal(rc, 0);
    assert_true(s < 1.5); /* not 40 x 100 ms */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(sv[0]);
    close(sv[1]);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    unlink(path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    chmod(path, mode);
}

static void test_secret_file_rules(void **state)
{
    (void)state;
    char dir[] = "/tmp/ty_auth_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], err[512];
    snprintf(path, sizeof(path), "%s/secret", dir);
    struct ty_auth a;
    struct ty_auth_config cfg = {.secret_file = path};

    /* missing */
    assert_int_equal(ty_auth_load(&a, &cfg, err, sizeof(err)), TY_ECONFIG);
    assert_non_null(strstr(err, "cluster_secret_file"));
    /* world-readable */
    write_file(path, "0123456789abcdef0123456789abcdef\n", 0644);
    assert_int_equal(ty_auth_load(&a, &cfg, err, sizeof(err)), TY_EACCES);
    assert_non_null(strstr(err, "chmod 600"));
    /* too short */
    write_file(path, "short\n", 0600);
    assert_int_equal(ty_auth_load(&a, &cfg, err, sizeof(err)), TY_ECONFIG);
    /* good; the newline is not part of the key */
    write_file(path, "0123456789abcdef0123456789abcdef\n", 0600);
    assert_int_equal(ty_auth_load(&a, &cfg, err, sizeof(err)), 0);
    assert_int_equal(a.key_len, 32);
    assert_false(a.insecure);
    /* both a secret and insecure: a contradiction, refused */
    cfg.insecure = true;
    assert_int_equal(ty_auth_load(&a, &cfg, err, sizeof(err)), TY_ECONFIG);
    /* neither: refused, naming both ways out */
    struct ty_auth_config none = {0};
    assert_int_equal(ty_auth_load(&a, &none, err, sizeof(err)), TY_ECONFIG);
    assert_non_null(strstr(err, "insecure: true"));
    none.insecure = true;
    assert_int_equal(ty_auth_load(&a, &none, err, sizeof(err)), 0);
    assert_true(a.insecure);
    /* gen-secret writes a usable 0600 file and never overwrites one */
    unlink(path);
    assert_int_equal(ty_auth_secret_create(path), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    cfg.insecure = false;
    assert_int_equal(ty_auth_load(&a, &cfg, err, sizeof(err)), 0);
    assert_int_equal(a.key_len, 64);
    assert_int_equal(ty_auth_secret_create(path), TY_EEXIST);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_secret_proves_both_ways),
        cmocka_unit_test(test_wrong_secret_refused_and_told),
        cmocka_unit_test(test_insecure_and_secure_never_pair),
        cmocka_unit_test(test_replayed_response_fails),
        cmocka_unit_test(test_foreign_bytes_fail_fast),
        cmocka_unit_test(test_bytes_after_handshake_left_for_protocol),
        cmocka_unit_test(test_blocking_sockets),
        cmocka_unit_test(test_one_deadline_for_the_exchange),
        cmocka_unit_test(test_secret_file_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
