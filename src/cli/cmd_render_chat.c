/* `tycho render-chat`: render a chat request with the model's own chat template, as the server
 * will, to see or check the exact prompt.
 *
 *   tycho render-chat --model PATH [--chat-template FILE] [--tokens] [--json]
 * reads one request body ({"messages": [...], "tools": [...], "add_generation_prompt": bool,
 * "chat_template_kwargs": {...}}) on stdin and prints the prompt exactly (no newline added);
 * --tokens prints its token ids instead, --json {"prompt": ..., "prompt_token_ids": [...]}.
 * PATH is a GGUF file, a Hugging Face model directory or a tokenizer directory/tokenizer.json.
 */
#include "cli.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tycho/chat_template.h"
#include "tycho/errors.h"
#include "tycho/tokenizer.h"

struct rc_args {
    const char *model, *tmpl;
    bool tokens, json;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: tycho render-chat --model PATH [--chat-template FILE] [--tokens] [--json]\n"
               "  reads a chat request body (JSON: messages, tools, add_generation_prompt,\n"
               "  chat_template_kwargs) on stdin and prints the prompt the model's chat template\n"
               "  makes of it, byte for byte\n"
               "  PATH: a .gguf file, a Hugging Face model directory, or a tokenizer directory\n"
               "  --chat-template FILE  use this Jinja template instead of the model's own\n"
               "  --tokens              print the prompt's token ids, one line, space-separated\n"
               "  --json                print {\"prompt\": ..., \"prompt_token_ids\": [...]}\n");
}

/* 0, TY_EINVAL (bad usage, message printed) or 1 for --help. */
static int parse_args(int argc, char **argv, struct rc_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--model") && i + 1 < argc)
            a->model = argv[++i];
        else if (!strcmp(s, "--chat-template") && i + 1 < argc)
            a->tmpl = argv[++i];
        else if (!strcmp(s, "--tokens"))
            a->tokens = true;
        else if (!strcmp(s, "--json"))
            a->json = true;
        else if (!strcmp(s, "--help") || !strcmp(s, "-h"))
            return 1;
        else {
            fprintf(stderr, "tycho render-chat: unknown or incomplete option '%s'\n", s);
            return TY_EINVAL;
        }
    }
    if (!a->model) {
        fprintf(stderr, "tycho render-chat: --model PATH is required\n");
        return TY_EINVAL;
    }
    return 0;
}

/* Token ids of the prompt as a JSON array, or NULL on error (printed). */
static json_t *prompt_ids(const ty_chat_tpl_t *t, const char *s, size_t n)
{
    int k = ty_chat_tpl_encode(t, s, n, NULL, 0);
    uint32_t *ids = k > 0 ? malloc(sizeof(uint32_t) * (size_t)k) : NULL;
    if (k > 0 && !ids)
        k = TY_ENOMEM;
    if (k > 0)
        k = ty_chat_tpl_encode(t, s, n, ids, (size_t)k);
    if (k < 0) {
        fprintf(stderr, "tycho render-chat: tokenizing the prompt: %s\n", ty_strerror(k));
        free(ids);
        return NULL;
    }
    json_t *arr = json_array();
    for (int i = 0; i < k; i++)
        json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    return arr;
}

static int print_result(const ty_chat_tpl_t *t, const struct rc_args *a, const char *s, size_t n)
{
    if (!a->tokens && !a->json)
        return fwrite(s, 1, n, stdout) == n ? 0 : TY_EIO;
    json_t *ids = prompt_ids(t, s, n);
    if (!ids)
        return TY_EINVAL;
    if (a->json) {
        json_t *o = json_pack("{s:s%,s:o}", "prompt", s, n, "prompt_token_ids", ids);
        json_dumpf(o, stdout, JSON_COMPACT);
        fputc('\n', stdout);
        json_decref(o);
        return 0;
    }
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v)
    {
        printf(i ? " %lld" : "%lld", (long long)json_integer_value(v));
    }
    fputc('\n', stdout);
    json_decref(ids);
    return 0;
}

static int render(const ty_chat_tpl_t *t, const struct rc_args *a)
{
    json_error_t je;
    json_t *req = json_loadf(stdin, 0, &je);
    if (!req) {
        fprintf(stderr, "tycho render-chat: stdin: bad JSON at line %d column %d: %s\n", je.line,
                je.column, je.text);
        return TY_EPARSE;
    }
    char err[512], *out;
    size_t len;
    int rc = ty_chat_tpl_render(t, req, &out, &len, err, sizeof(err));
    json_decref(req);
    if (rc) {
        fprintf(stderr, "tycho render-chat: %s\n", err);
        return rc;
    }
    rc = print_result(t, a, out, len);
    free(out);
    return rc;
}

static int run(int argc, char **argv)
{
    struct rc_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        usage(rc == 1 ? stdout : stderr);
        return rc == 1 ? TY_CLI_EXIT_OK : TY_CLI_EXIT_USAGE;
    }
    char err[512] = "";
    ty_tokenizer_t *tok;
    rc = ty__cli_open_tokenizer(a.model, &tok, err, sizeof(err));
    if (rc) {
        if (!strstr(err, a.model)) /* the loader's message usually names the path */
            fprintf(stderr, "tycho render-chat: %s: %s\n", a.model, err[0] ? err : ty_strerror(rc));
        else
            fprintf(stderr, "tycho render-chat: %s\n", err);
        return TY_CLI_EXIT_FAIL;
    }
    ty_chat_tpl_t *t;
    rc = ty_chat_tpl_new(&t, tok, a.tmpl, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "tycho render-chat: %s: %s\n", a.model, err);
    } else {
        rc = render(t, &a);
        ty_chat_tpl_free(t);
    }
    ty_tokenizer_free(tok);
    return rc ? TY_CLI_EXIT_FAIL : TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_render_chat = {
    .name = "render-chat",
    .summary = "render a chat request with the model's chat template (prompt or token ids)",
    .run = run,
};
