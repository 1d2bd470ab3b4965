/* `tycho check-config --role ROLE [--config FILE] [--setting=value ...]`: the daemons'
 * --check-config mode with the very table each daemon loads. Prints "FILE: ok" and exits 0, or
 * prints the one error and exits 2, exactly as `DAEMON --config FILE --check-config` does.
 */
#include "check_config.h"
#include "cli.h"

#include "tycho/conductor.h"
#include "tycho/config.h"
#include "tycho/daemon.h"
#include "tycho/errors.h"
#include "tycho/node.h"
#include "tycho/serve_local.h"
#include "tycho/store_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct ty_cli_config_role ty_cli_config_roles[] = {
    {"conductor", "tycho-conductor", "the Conductor: OpenAI API and node registry",
     &ty_conductor_config_table},
    {"serve", "tycho serve", "all roles in one process: the Conductor's settings plus engine:",
     &ty_serve_config_table},
    {"prefill", "tycho-prefill", "a prefill node", &ty_node_config_table},
    {"decode", "tycho-decode", "a decode node", &ty_node_config_table},
    {"store", "tycho-store", "a KV pool node and/or its master", &ty_store_config_table},
};
const size_t ty_cli_config_n_roles = sizeof(ty_cli_config_roles) / sizeof(ty_cli_config_roles[0]);

const struct ty_cli_config_role *ty_cli_config_role_find(const char *name)
{
    for (size_t i = 0; i < ty_cli_config_n_roles; i++)
        if (strcmp(ty_cli_config_roles[i].name, name) == 0)
            return &ty_cli_config_roles[i];
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: tycho check-config --role ROLE [--config FILE] [--dump-config] "
               "[--setting=VALUE ...]\n\nroles:\n");
    for (size_t i = 0; i < ty_cli_config_n_roles; i++)
        fprintf(f, "  %-10s %-16s %s\n", ty_cli_config_roles[i].name,
                ty_cli_config_roles[i].daemon, ty_cli_config_roles[i].summary);
    fprintf(f, "\n`tycho check-config --role ROLE --help` lists the role's settings.\n");
}

/* Take "--role X" / "--role=X" out of argv; the rest goes to the daemon parser. */
static const char *take_role(int argc, char **argv, char **rest, int *n_rest)
{
    const char *role = NULL;
    *n_rest = 0;
    rest[(*n_rest)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--role") && i + 1 < argc)
            role = argv[++i];
        else if (!strncmp(argv[i], "--role=", 7))
            role = argv[i] + 7;
        else
            rest[(*n_rest)++] = argv[i];
    }
    return role;
}

static int run_check_config(int argc, char **argv)
{
    char **rest = calloc((size_t)argc + 2, sizeof(*rest));
    if (!rest)
        return TY_CLI_EXIT_FAIL;
    int n_rest;
    const char *role_name = take_role(argc, argv, rest, &n_rest);
    const struct ty_cli_config_role *role = role_name ? ty_cli_config_role_find(role_name) : NULL;
    bool dump = false, help = false;
    for (int i = 1; i < n_rest; i++) {
        dump |= !strcmp(rest[i], "--dump-config");
        help |= !strcmp(rest[i], "--help") || !strcmp(rest[i], "-h");
    }
    if (!role) {
        if (role_name)
            fprintf(stderr, "tycho check-config: unknown role '%s'\n\n", role_name);
        usage(help ? stdout : stderr);
        free(rest);
        return help && !role_name ? TY_CLI_EXIT_OK : TY_CLI_EXIT_USAGE;
    }
    if (!dump && !help)
        rest[n_rest++] = "--check-config";
    void *data = calloc(1, role->root->size);
    ty_daemon_t *d = NULL;
    int code = TY_CLI_EXIT_FAIL;
    char name[64];
    snprintf(name, sizeof(name), "tycho check-config --role %s", role->name);
    const struct ty_daemon_opts opts = {.name = name, .summary = role->summary,
                                        .table = role->root, .config = data};
    if (data && ty_daemon_new(&d, &opts, n_rest, rest, &code) == 0)
        ty_daemon_free(d); /* not reached: check mode always exits */
    free(data);
    free(rest);
    return code;
}

const struct ty_cli_command ty_cli_cmd_check_config = {
    "check-config", "validate a daemon's YAML settings (exit 2 on the first error)",
    run_check_config};
