/* `tycho version`: same as `tycho --version`, as a subcommand so scripts can rely on either. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static int run_version(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: tycho version   (the same as tycho --version)\n");
        return TY_CLI_EXIT_OK;
    }
    printf("tycho %s (%s)\n", TY_VERSION, TY_GIT_REV);
    printf("  cuda: %s\n", TY_BUILD_CUDA ? "built" : "not built");
    printf("  build: %s\n", TY_BUILD_TYPE);
    return TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_version = {"version", "print the version", run_version};
