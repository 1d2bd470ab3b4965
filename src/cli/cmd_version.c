/* `tycho version`: same as `tycho --version`, as a subcommand so scripts can rely on either. */
#include "cli.h"

#include <stdio.h>

static int run_version(int argc, char **argv)
{
    printf("tycho %s (%s)\n", TY_VERSION, TY_GIT_REV);
    return TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_version = {"version", "print the version", run_version};
