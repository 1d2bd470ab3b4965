/* Daemon scaffolding: what every Tycho daemon's main() calls.
 *
 * ty_daemon_new() reads the command line (--config FILE, --check-config, --dump-config, --help,
 * --version, --<setting>=value) and the environment into the daemon's settings struct;
 * ty_daemon_start() then hooks the daemon to its libuv loop: SIGTERM/SIGINT call the drain
 * callback (a second signal, or the drain timeout, stops at once), SIGHUP re-reads the file and
 * applies the fields marked TY_CONFIG_RELOADABLE, and under systemd it sends READY=1,
 * STOPPING=1, RELOADING=1 and WATCHDOG=1 (at half of WATCHDOG_USEC, only while the alive
 * callback, when there is one, says the daemon makes progress).
 *
 * Threading: everything runs on the loop's thread, callbacks included. Ownership: the caller
 * owns the settings struct; the daemon owns the strings and lists in it until ty_daemon_free().
 *
 *     int main(int argc, char **argv) {
 *         struct ty_conductor_config cfg;
 *         ty_daemon_t *d;
 *         int code;
 *         struct ty_daemon_opts o = {.name = "tycho-conductor", .table = &ty_conductor_config_table,
 *                                    .config = &cfg, .drain = on_drain, .reload = on_reload};
 *         if (ty_daemon_new(&d, &o, argc, argv, &code) != 0)
 *             return code;              // --help, --check-config, a bad config...
 *         ... set up servers on loop ...
 *         ty_daemon_start(d, loop);     // READY=1
 *         uv_run(loop, UV_RUN_DEFAULT); // until on_drain's work calls ty_daemon_stop()
 *         ty_daemon_free(d);
 *     }
 */
#ifndef TYCHO_DAEMON_H
#define TYCHO_DAEMON_H

#include "tycho/config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct ty_daemon ty_daemon_t;
struct ty_auth;

/* SIGTERM/SIGINT: stop taking new work, finish what is in flight, then call ty_daemon_stop(). */
typedef void (*ty_daemon_drain_cb)(ty_daemon_t *d, void *arg);
/* Whether the daemon's work makes progress (e.g. no engine call has run past its stall limit):
 * false, with `why` filled, holds back systemd's WATCHDOG=1 so that a hung daemon is
 * restarted. Called on the loop thread at each keep-alive. */
typedef bool (*ty_daemon_alive_cb)(void *arg, char *why, size_t cap);
/* After SIGHUP applied a re-read config; `n_changed` reloadable fields changed. */
typedef void (*ty_daemon_reload_cb)(ty_daemon_t *d, unsigned n_changed, void *arg);

struct ty_daemon_opts {
    const char *name;                     /* "tycho-conductor": --help, --version, logs */
    const char *summary;                  /* one line for --help; may be NULL */
    const struct ty_config_struct *table; /* the settings table (borrowed) */
    void *config;                         /* the settings struct to fill (borrowed) */
    ty_daemon_drain_cb drain;             /* NULL: stop at once */
    ty_daemon_reload_cb reload;           /* may be NULL */
    ty_daemon_alive_cb alive;             /* NULL: the loop running is alive enough */
    void *arg;                            /* for the callbacks */
    uint64_t drain_timeout_ms;            /* force the stop after this; 0: 30 s */
    struct ty_auth *auth; /* filled from the table's root rows cluster_secret_file / insecure
                           * (TY_AUTH_CONFIG_ROWS) when it has them, before the daemon runs and in
                           * --check-config: a missing, short or world-readable secret is a
                           * config error (exit 2), insecure is logged as a warning. Caller-owned;
                           * NULL: not wanted */
};

/* Parse argv and the environment into opts->config. Returns 0 when the daemon should run;
 * otherwise *exit_code says how main() should exit: TY_ECANCELED after --help, --version,
 * --dump-config or a passing --check-config (exit 0), TY_ECONFIG for a bad setting or
 * command line (message on stderr, exit 2). */
int ty_daemon_new(ty_daemon_t **out, const struct ty_daemon_opts *opts, int argc, char **argv,
                  int *exit_code);

/* Install the signal handlers and watchdog timer on `loop` and tell systemd READY=1. */
int ty_daemon_start(ty_daemon_t *d, uv_loop_t *loop);

/* Drained (or giving up): send STOPPING=1 if not sent yet, close the daemon's handles and
 * uv_stop() the loop. Idempotent. */
void ty_daemon_stop(ty_daemon_t *d);

/* Free the daemon and the strings and lists of its settings. Call after the loop stopped and
 * ran its close callbacks. NULL is a no-op. */
void ty_daemon_free(ty_daemon_t *d);

/* Load defaults < file < environment < flags for `table` into `data`, as ty_daemon_new does,
 * without the daemon: for tools and tests. `config_path` may be NULL; `args` are "--k=v". */
int ty_daemon_load_config(ty_config_t **out, const struct ty_config_struct *table, void *data,
                          const char *config_path, char *const *args, int n_args,
                          struct ty_config_error *err);

#endif
