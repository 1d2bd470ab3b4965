/* The roles `tycho check-config --role ROLE` knows, each with the one settings table its
 * daemon loads (src/cli/cmd_check_config.c). The list lives in the CLI, which links every
 * component, so ty_common depends on none of them. Immutable; any thread may read it.
 */
#ifndef TYCHO_CLI_CHECK_CONFIG_H
#define TYCHO_CLI_CHECK_CONFIG_H

#include "tycho/config.h"

#include <stddef.h>

struct ty_cli_config_role {
    const char *name;    /* "conductor" */
    const char *daemon;  /* what loads the table: "tycho-conductor", "tycho serve" */
    const char *summary;
    const struct ty_config_struct *root;
};

extern const struct ty_cli_config_role ty_cli_config_roles[];
extern const size_t ty_cli_config_n_roles;

/* The role called `name`, or NULL. */
const struct ty_cli_config_role *ty_cli_config_role_find(const char *name);

#endif
