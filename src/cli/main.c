/* tycho: the command-line entry point. Dispatches to the subcommands in cmd_*.c. */
#include "cli.h"
#include "cli_commands.h" /* generated: extern declarations and ty_cli_commands[] */

#include <stdio.h>
#include <string.h>

static void print_help(FILE *f)
{
    fprintf(f, "usage: tycho [--version] [--help] <command> [args]\n\n"
               "Tycho: KVCache-centric disaggregated LLM serving.\n\ncommands:\n");
    for (size_t i = 0; i < ty_cli_n_commands; i++)
        fprintf(f, "  %-16s %s\n", ty_cli_commands[i]->name, ty_cli_commands[i]->summary);
    fprintf(f, "\nRun `tycho <command> --help` for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_help(stderr);
        return TY_CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        char *args[] = {"version", NULL};
        return ty_cli_cmd_version.run(1, args);
    }
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        print_help(stdout);
        return TY_CLI_EXIT_OK;
    }
    for (size_t i = 0; i < ty_cli_n_commands; i++) {
        if (strcmp(cmd, ty_cli_commands[i]->name) == 0)
            return ty_cli_commands[i]->run(argc - 1, argv + 1);
    }
    fprintf(stderr, "tycho: unknown command '%s'\n\n", cmd);
    print_help(stderr);
    return TY_CLI_EXIT_USAGE;
}
