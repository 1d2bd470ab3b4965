/* `tycho gen-secret FILE`: write a fresh cluster secret (64 hex characters, mode 0600) for
 * cluster_secret_file. It never overwrites: an existing file is kept and reported. */
#include "cli.h"

#include "tycho/auth.h"
#include "tycho/errors.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: tycho gen-secret FILE\n\n"
               "Write a new random cluster secret to FILE (mode 0600; never overwrites). Name it\n"
               "in every daemon's cluster_secret_file (or TYCHO_CLUSTER_SECRET_FILE) and copy it\n"
               "to each host of the cluster.\n");
}

static int run_gen_secret(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return TY_CLI_EXIT_OK;
    }
    if (argc != 2 || argv[1][0] == '-') {
        usage(stderr);
        return TY_CLI_EXIT_USAGE;
    }
    int rc = ty_auth_secret_create(argv[1]);
    if (rc == TY_EEXIST) {
        fprintf(stderr, "tycho gen-secret: %s exists; not overwritten\n", argv[1]);
        return TY_CLI_EXIT_FAIL;
    }
    if (rc) {
        fprintf(stderr, "tycho gen-secret: %s: %s\n", argv[1], ty_strerror(rc));
        return TY_CLI_EXIT_FAIL;
    }
    printf("%s: a new cluster secret (mode 0600)\n", argv[1]);
    return TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_gen_secret = {
    "gen-secret", "write a new cluster secret file (cluster_secret_file)", run_gen_secret};
