/* Daemon scaffolding: command line, config layers, signals, systemd notification.
 * Everything runs on the loop thread (see daemon.h).
 */
#include "tycho/daemon.h"

#include "tycho/auth.h"
#include "tycho/errors.h"
#include "tycho/log.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

struct ty_daemon {
    struct ty_daemon_opts opts;
    ty_config_t *cfg;
    char *config_path;
    char **args; /* the --setting=value arguments, kept for reloads */
    int n_args;
    uv_loop_t *loop;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t watchdog, drain_timer;
    bool started, draining, stopped;
    bool withheld; /* the last keep-alive was held back (the alive callback said no) */
};

/* ---- configuration ------------------------------------------------------------------------ */

static void apply_log_level(ty_config_t *cfg)
{
    enum ty_config_type t;
    const int *lv = ty_config_lookup(cfg, "log_level", &t);
    if (lv && t == TY_CONFIG_ENUM)
        ty_log_set_level((enum ty_log_level)*lv);
    const int *lf = ty_config_lookup(cfg, "log_format", &t);
    if (lf && t == TY_CONFIG_ENUM)
        ty_log_set_format((enum ty_log_format)*lf);
}

int ty_daemon_load_config(ty_config_t **out, const struct ty_config_struct *table, void *data,
                          const char *config_path, char *const *args, int n_args,
                          struct ty_config_error *err)
{
    ty_config_t *cfg = NULL;
    const struct ty_config_opts o = {.root = table, .data = data};
    int rc = ty_config_new(&cfg, &o, err);
    if (rc != 0)
        return rc;
    if (config_path)
        rc = ty_config_load_file(cfg, config_path, err);
    if (rc == 0)
        rc = ty_config_load_env(cfg, err);
    for (int i = 0; rc == 0 && i < n_args; i++) {
        rc = ty_config_set_arg(cfg, args[i], err);
        if (rc == TY_ENOTFOUND)
            rc = TY_ECONFIG;
    }
    if (rc == 0)
        rc = ty_config_finish(cfg, err);
    if (rc != 0) {
        ty_config_free(cfg);
        return rc;
    }
    *out = cfg;
    return 0;
}

/* ---- command line ------------------------------------------------------------------------ */

enum mode { MODE_RUN, MODE_CHECK, MODE_DUMP, MODE_HELP, MODE_VERSION };

static void print_help(const struct ty_daemon_opts *o)
{
    printf("usage: %s [--config FILE] [--check-config] [--dump-config] [--<setting>=VALUE ...]\n",
           o->name);
    if (o->summary)
        printf("\n%s\n", o->summary);
    printf("\noptions:\n"
           "  --config FILE                      YAML settings file\n"
           "  --check-config                     validate the settings, print 'FILE: ok', exit\n"
           "  --dump-config                      print the effective settings as YAML, exit\n"
           "  --help, --version\n\nsettings:\n");
    ty_config_help(o->table, stdout);
}

/* Sort argv into the daemon's own options and --setting=value arguments. */
static int parse_args(ty_daemon_t *d, int argc, char **argv, enum mode *mode)
{
    *mode = MODE_RUN;
    d->args = calloc((size_t)argc + 1, sizeof(*d->args));
    TY_ASSERT(d->args);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *mode = MODE_HELP;
        } else if (!strcmp(a, "--version") || !strcmp(a, "-V")) {
            *mode = MODE_VERSION;
        } else if (!strcmp(a, "--check-config")) {
            *mode = *mode == MODE_RUN ? MODE_CHECK : *mode;
        } else if (!strcmp(a, "--dump-config")) {
            *mode = *mode == MODE_RUN ? MODE_DUMP : *mode;
        } else if (!strcmp(a, "--config") || !strncmp(a, "--config=", 9)) {
            const char *path = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!path || !*path) {
                fprintf(stderr, "%s: --config needs a file name\n", d->opts.name);
                return TY_ECONFIG;
            }
            free(d->config_path);
            d->config_path = strdup(path);
            TY_ASSERT(d->config_path);
        } else if (!strncmp(a, "--", 2)) {
            d->args[d->n_args++] = strdup(a);
            TY_ASSERT(d->args[d->n_args - 1]);
        } else {
            fprintf(stderr, "%s: unexpected argument '%s' (settings are --key=value)\n",
                    d->opts.name, a);
            return TY_ECONFIG;
        }
    }
    return 0;
}

static int finish_mode(ty_daemon_t *d, enum mode mode, int *exit_code)
{
    switch (mode) {
    case MODE_CHECK:
        printf("%s: ok\n", d->config_path ? d->config_path : "configuration");
        break;
    case MODE_DUMP:
        if (ty_config_dump(d->cfg, stdout) != 0) {
            *exit_code = 1;
            return TY_EIO;
        }
        break;
    default:
        return 0;
    }
    *exit_code = 0;
    return TY_ECANCELED;
}

/* The root field `key` of the daemon's table, or NULL. */
static const struct ty_config_field *root_field(const struct ty_config_struct *t, const char *key)
{
    for (size_t i = 0; i < t->n_fields; i++)
        if (!strcmp(t->fields[i].key, key))
            return &t->fields[i];
    return NULL;
}

/* Load the cluster secret named by the settings (when the table has the rows). */
static int load_auth(const ty_daemon_t *d, enum mode mode)
{
    const struct ty_daemon_opts *o = &d->opts;
    const struct ty_config_field *f = root_field(o->table, "cluster_secret_file");
    const struct ty_config_field *g = root_field(o->table, "insecure");
    if (!f || !g)
        return 0;
    struct ty_auth_config ac = {.secret_file = *(char **)((char *)o->config + f->offset),
                                .insecure = *(bool *)((char *)o->config + g->offset)};
    struct ty_auth scratch, *a = o->auth ? o->auth : &scratch;
    char err[512];
    int rc = ty_auth_load(a, &ac, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "%s: %s\n", d->config_path ? d->config_path : o->name, err);
        return TY_ECONFIG;
    }
    if (a->insecure && mode == MODE_RUN)
        TY_LOG_WARN("daemon", "insecure: true: the RPC, transfer and store ports serve anyone "
                    "who reaches them; give the cluster a secret (cluster_secret_file)");
    return 0;
}

int ty_daemon_new(ty_daemon_t **out, const struct ty_daemon_opts *opts, int argc, char **argv,
                  int *exit_code)
{
    ty_daemon_t *d = calloc(1, sizeof(*d));
    TY_ASSERT(d);
    d->opts = *opts;
    if (!d->opts.name)
        d->opts.name = "tycho";
    if (!d->opts.drain_timeout_ms)
        d->opts.drain_timeout_ms = 30000;
    *exit_code = 2;
    enum mode mode;
    int rc = parse_args(d, argc, argv, &mode);
    if (rc == 0 && (mode == MODE_HELP || mode == MODE_VERSION)) {
        if (mode == MODE_HELP)
            print_help(&d->opts);
        else
            printf("%s %s\n", d->opts.name, TY_VERSION);
        *exit_code = 0;
        ty_daemon_free(d);
        return TY_ECANCELED;
    }
    struct ty_config_error err;
    memset(&err, 0, sizeof(err));
    if (rc == 0) {
        rc = ty_daemon_load_config(&d->cfg, opts->table, opts->config, d->config_path, d->args,
                                   d->n_args, &err);
        if (rc != 0)
            fprintf(stderr, "%s\n", err.msg);
        else
            apply_log_level(d->cfg); /* before anything below logs */
        if (rc == 0 && mode != MODE_DUMP)
            rc = load_auth(d, mode);
        rc = rc != 0 ? TY_ECONFIG : finish_mode(d, mode, exit_code);
    }
    if (rc != 0) {
        ty_daemon_free(d);
        return rc;
    }
    apply_log_level(d->cfg);
    *exit_code = 0;
    *out = d;
    return 0;
}

/* ---- running ------------------------------------------------------------------------------ */

/* Re-read the configuration (SIGHUP). Returns 0 or the load error (the running settings are
 * kept). */
static int daemon_reload(ty_daemon_t *d)
{
    void *fresh_data = calloc(1, d->opts.table->size);
    TY_ASSERT(fresh_data);
    ty_config_t *fresh = NULL;
    struct ty_config_error err;
    memset(&err, 0, sizeof(err));
    unsigned n = 0;
    sd_notify(0, "RELOADING=1");
    int rc = ty_daemon_load_config(&fresh, d->opts.table, fresh_data, d->config_path, d->args,
                                   d->n_args, &err);
    if (rc != 0) {
        TY_LOG_ERROR("daemon", "reload failed, keeping the running settings: %s", err.msg);
    } else {
        rc = ty_config_reload(d->cfg, fresh, &n);
        ty_config_free(fresh);
        apply_log_level(d->cfg);
        TY_LOG_INFO("daemon", "reloaded %s: %u setting(s) changed",
                    d->config_path ? d->config_path : "settings", n);
    }
    free(fresh_data);
    sd_notify(0, "READY=1");
    if (rc == 0 && d->opts.reload)
        d->opts.reload(d, n, d->opts.arg);
    return rc;
}

static void on_drain_timeout(uv_timer_t *t)
{
    ty_daemon_t *d = t->data;
    TY_LOG_WARN("daemon", "drain did not finish in %llu ms; stopping",
                (unsigned long long)d->opts.drain_timeout_ms);
    ty_daemon_stop(d);
}

static void on_signal(uv_signal_t *h, int signum)
{
    ty_daemon_t *d = h->data;
    if (signum == SIGHUP) {
        daemon_reload(d);
        return;
    }
    if (d->draining) {
        TY_LOG_WARN("daemon", "second %s: stopping now", strsignal(signum));
        ty_daemon_stop(d);
        return;
    }
    d->draining = true;
    TY_LOG_INFO("daemon", "%s: draining", strsignal(signum));
    sd_notify(0, "STOPPING=1");
    if (!d->opts.drain) {
        ty_daemon_stop(d);
        return;
    }
    uv_timer_start(&d->drain_timer, on_drain_timeout, d->opts.drain_timeout_ms, 0);
    d->opts.drain(d, d->opts.arg);
}

static void on_watchdog(uv_timer_t *t)
{
    ty_daemon_t *d = t->data;
    char why[256] = "";
    if (d->opts.alive && !d->opts.alive(d->opts.arg, why, sizeof(why))) {
        if (!d->withheld)
            TY_LOG_ERROR("daemon", "%s: holding back the systemd watchdog keep-alive so that "
                         "systemd restarts this daemon", why);
        d->withheld = true;
        return;
    }
    if (d->withheld)
        TY_LOG_WARN("daemon", "progress again: systemd watchdog keep-alives resume");
    d->withheld = false;
    sd_notify(0, "WATCHDOG=1");
}

int ty_daemon_start(ty_daemon_t *d, uv_loop_t *loop)
{
    if (d->started)
        return TY_EALREADY;
    d->loop = loop;
    uv_signal_t *sigs[] = {&d->sig_term, &d->sig_int, &d->sig_hup};
    const int nums[] = {SIGTERM, SIGINT, SIGHUP};
    for (int i = 0; i < 3; i++) {
        uv_signal_init(loop, sigs[i]);
        sigs[i]->data = d;
        int rc = uv_signal_start(sigs[i], on_signal, nums[i]);
        if (rc != 0)
            return rc;
    }
    uv_timer_init(loop, &d->watchdog);
    uv_timer_init(loop, &d->drain_timer);
    d->watchdog.data = d->drain_timer.data = d;
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        uint64_t period = usec / 2000 ? usec / 2000 : 1;
        uv_timer_start(&d->watchdog, on_watchdog, period, period);
        TY_LOG_INFO("daemon", "systemd watchdog: pinging every %llu ms",
                    (unsigned long long)period);
    }
    d->started = true;
    sd_notify(0, "READY=1");
    return 0;
}

void ty_daemon_stop(ty_daemon_t *d)
{
    if (d->stopped || !d->started)
        return;
    d->stopped = true;
    if (!d->draining)
        sd_notify(0, "STOPPING=1");
    uv_handle_t *hs[] = {(uv_handle_t *)&d->sig_term, (uv_handle_t *)&d->sig_int,
                         (uv_handle_t *)&d->sig_hup, (uv_handle_t *)&d->watchdog,
                         (uv_handle_t *)&d->drain_timer};
    for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++)
        if (!uv_is_closing(hs[i]))
            uv_close(hs[i], NULL);
    uv_stop(d->loop);
}

void ty_daemon_free(ty_daemon_t *d)
{
    if (!d)
        return;
    if (d->started) {
        ty_daemon_stop(d);
        uv_run(d->loop, UV_RUN_NOWAIT); /* run the close callbacks of our handles */
    }
    ty_config_free(d->cfg);
    for (int i = 0; i < d->n_args; i++)
        free(d->args[i]);
    free(d->args);
    free(d->config_path);
    free(d);
}
