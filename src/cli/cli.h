/* The `tycho` command line: one subcommand per cmd_<name>.c file in this folder.
 *
 * Each cmd_<file>.c defines `const struct ty_cli_command ty_cli_cmd_<file>`; the build scans
 * the folder and generates the command table, so adding a subcommand touches no shared file.
 * A subcommand's run() gets argv with argv[0] set to the subcommand name and returns the
 * process exit code (0 ok, 1 runtime failure, 2 usage or configuration error).
 */
#ifndef TYCHO_CLI_H
#define TYCHO_CLI_H

struct ty_cli_command {
    const char *name;    /* as typed: "generate", "cache-sim" */
    const char *summary; /* one line for `tycho --help` */
    int (*run)(int argc, char **argv);
};

#define TY_CLI_EXIT_OK 0
#define TY_CLI_EXIT_FAIL 1
#define TY_CLI_EXIT_USAGE 2

#include <stddef.h>
struct ty_tokenizer;
/* A tokenizer from a GGUF file (by its magic) or a tokenizer.json file or directory, as
 * `tycho tokenize` and `tycho render-chat` take it. Returns 0 or a TY_E* with a message in eb. */
int ty__cli_open_tokenizer(const char *path, struct ty_tokenizer **tok, char *eb, size_t el);

#endif
