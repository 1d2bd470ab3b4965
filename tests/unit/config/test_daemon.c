/* Daemon scaffolding with real signals and a real sd_notify socket: flags beat the file,
 * --check-config exit codes, READY=1 / WATCHDOG=1 / RELOADING=1 / STOPPING=1 reach the
 * NOTIFY_SOCKET, SIGHUP re-reads the file and changes only reloadable fields, SIGTERM calls the
 * drain callback and the loop ends when it calls ty_daemon_stop().
 */
#include "tycho/config.h"
#include "tycho/daemon.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

static char cfg_path[64];

/* A daemon's settings, as the daemons write theirs (tycho/conductor.h, tycho/store_config.h). */
struct limits {
    uint32_t max_connections;
};
struct settings {
    char *listen_host;
    uint16_t listen_port;
    char *model_path;
    int log_level;
    struct limits limits;
};
static const struct ty_config_field limit_fields[] = {
    {.key = "max_connections", .type = TY_CONFIG_UINT,
     TY_CONFIG_AT(struct limits, max_connections), .def = "4096", .min = "1",
     .flags = TY_CONFIG_RELOADABLE, .help = "concurrent client connections"},
};
static const struct ty_config_struct limits_table =
    TY_CONFIG_STRUCT("limits", struct limits, limit_fields);
static const struct ty_config_field fields[] = {
    {.key = "listen_host", .type = TY_CONFIG_STRING, TY_CONFIG_AT(struct settings, listen_host),
     .def = "127.0.0.1", .min = "1", .help = "listen address"},
    {.key = "listen_port", .type = TY_CONFIG_UINT, TY_CONFIG_AT(struct settings, listen_port),
     .def = "8000", .min = "1", .max = "65535", .help = "listen port"},
    {.key = "model_path", .type = TY_CONFIG_STRING, TY_CONFIG_AT(struct settings, model_path),
     .min = "1", .flags = TY_CONFIG_REQUIRED, .help = "model"},
    {.key = "log_level", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(struct settings, log_level),
     .def = "info", .enum_names = ty_config_log_level_names, .flags = TY_CONFIG_RELOADABLE,
     .help = "log threshold"},
    {.key = "limits", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(struct settings, limits),
     .sub = &limits_table, .help = "limits"},
};
static const struct ty_config_struct table = TY_CONFIG_STRUCT("t", struct settings, fields);

static void write_file(const char *text)
{
    FILE *f = fopen(cfg_path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_check_mode(void **state)
{
    struct settings c;
    ty_daemon_t *d = NULL;
    int code = -1;
    const struct ty_daemon_opts o = {.name = "t", .table = &table,
                                     .config = &c};
    write_file("model_path: /m\nlisten_port: 8000\n");
    char *ok[] = {"t", "--config", cfg_path, "--check-config", NULL};
    assert_int_equal(ty_daemon_new(&d, &o, 4, ok, &code), TY_ECANCELED);
    assert_int_equal(code, 0);
    write_file("model_path: /m\nlisten_port: 0\n");
    assert_int_equal(ty_daemon_new(&d, &o, 4, ok, &code), TY_ECONFIG);
    assert_int_equal(code, 2);
    char *bad_arg[] = {"t", "stray", NULL};
    assert_int_equal(ty_daemon_new(&d, &o, 2, bad_arg, &code), TY_ECONFIG);
    assert_int_equal(code, 2);
    char *missing[] = {"t", "--check-config", NULL}; /* model_path is required */
    assert_int_equal(ty_daemon_new(&d, &o, 2, missing, &code), TY_ECONFIG);
    assert_int_equal(code, 2);
}

struct run_state {
    ty_daemon_t *d;
    struct settings *c;
    uv_timer_t kick, drain_done;
    unsigned reloads, reload_changed, drains;
};

static void on_drain_done(uv_timer_t *t)
{
    struct run_state *s = t->data;
    uv_close((uv_handle_t *)&s->kick, NULL);
    uv_close((uv_handle_t *)&s->drain_done, NULL);
    ty_daemon_stop(s->d);
}

static void on_drain(ty_daemon_t *d, void *arg)
{
    struct run_state *s = arg;
    s->drains++;
    uv_timer_start(&s->drain_done, on_drain_done, 30, 0); /* "finish in-flight work" */
}

static void on_reload(ty_daemon_t *d, unsigned n_changed, void *arg)
{
    struct run_state *s = arg;
    s->reloads++;
    s->reload_changed = n_changed;
    raise(SIGTERM);
}

static void on_kick(uv_timer_t *t)
{
    /* max_connections and log_level are reloadable, listen_host is not */
    write_file("model_path: /m\nlisten_host: 0.0.0.0\nlog_level: warn\n"
               "limits: {max_connections: 20}\n");
    raise(SIGHUP);
}

static int notify_socket(void)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "/tmp/ty-notify-%d.sock", (int)getpid());
    unlink(sa.sun_path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    setenv("NOTIFY_SOCKET", sa.sun_path, 1);
    return fd;
}

static void read_notifications(int fd, char *all, size_t cap)
{
    all[0] = '\0';
    char msg[256];
    ssize_t n;
    while ((n = recv(fd, msg, sizeof(msg) - 1, MSG_DONTWAIT)) > 0) {
        msg[n] = '\0';
        strncat(all, msg, cap - strlen(all) - 2);
        strcat(all, "|");
    }
}

static void test_signals_and_notify(void **state)
{
    int fd = notify_socket();
    char pid[32];
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    setenv("WATCHDOG_USEC", "100000", 1); /* ping every 50 ms */
    setenv("WATCHDOG_PID", pid, 1);
    write_file("model_path: /m\nlisten_host: 127.0.0.1\nlisten_port: 8000\nlog_level: info\n"
               "limits: {max_connections: 10}\n");
    struct settings c;
    struct run_state s = {.c = &c};
    const struct ty_daemon_opts o = {.name = "t", .table = &table,
                                     .config = &c, .drain = on_drain, .reload = on_reload,
                                     .arg = &s};
    char *argv[] = {"t", "--config", cfg_path, "--listen-port=9000", NULL};
    int code;
    assert_int_equal(ty_daemon_new(&s.d, &o, 4, argv, &code), 0);
    assert_int_equal(c.listen_port, 9000); /* flag beats file */
    assert_int_equal(c.limits.max_connections, 10);

    uv_loop_t loop;
    uv_loop_init(&loop);
    uv_timer_init(&loop, &s.kick);
    uv_timer_init(&loop, &s.drain_done);
    s.kick.data = s.drain_done.data = &s;
    assert_int_equal(ty_daemon_start(s.d, &loop), 0);
    uv_timer_start(&s.kick, on_kick, 150, 0);
    uv_run(&loop, UV_RUN_DEFAULT);

    assert_int_equal(s.reloads, 1);
    assert_int_equal(s.reload_changed, 2);
    assert_int_equal(c.limits.max_connections, 20);
    assert_int_equal(ty_log_get_level(), TY_LOG_LEVEL_WARN);
    assert_string_equal(c.listen_host, "127.0.0.1"); /* needs a restart: kept */
    assert_int_equal(c.listen_port, 9000);
    assert_int_equal(s.drains, 1);
    ty_daemon_free(s.d);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);

    char all[4096];
    read_notifications(fd, all, sizeof(all));
    printf("notifications: %s\n", all);
    assert_non_null(strstr(all, "READY=1|"));
    assert_non_null(strstr(all, "WATCHDOG=1|"));
    assert_non_null(strstr(all, "RELOADING=1|"));
    assert_non_null(strstr(all, "STOPPING=1|"));
    assert_true(strstr(all, "READY=1") < strstr(all, "STOPPING=1"));
    close(fd);
    unsetenv("NOTIFY_SOCKET");
    ty_log_set_level(TY_LOG_LEVEL_INFO);
}

int main(void)
{
    snprintf(cfg_path, sizeof(cfg_path), "/tmp/ty-daemon-test-%d.yaml", (int)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_mode),
        cmocka_unit_test(test_signals_and_notify),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char sock[64];
    snprintf(sock, sizeof(sock), "/tmp/ty-notify-%d.sock", (int)getpid());
    unlink(cfg_path);
    unlink(sock);
    return rc;
}
