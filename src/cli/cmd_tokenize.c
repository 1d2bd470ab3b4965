/* `tycho tokenize`: text to token ids with a model's tokenizer.
 *
 *   tycho tokenize --tokenizer PATH [--add-special] [--parse-special] --jsonl
 *       reads JSON lines {"text": "..."} on stdin, writes {"ids":[...]} lines on stdout;
 *   tycho tokenize --tokenizer PATH [--add-special] [--parse-special] --text TEXT
 *       prints one {"ids":[...]} line;
 *   tycho tokenize --tokenizer PATH --decode
 *       reads JSON lines {"ids":[...]} and writes {"text":"..."} lines.
 * PATH is a tokenizer.json, a Hugging Face directory or a GGUF file (recognised by its magic).
 */
#include "cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tycho/errors.h"
#include "tycho/gguf.h"
#include "tycho/tokenizer.h"

struct tok_args {
    const char *path, *text;
    bool add_special, parse_special, jsonl, decode;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: tycho tokenize --tokenizer PATH [--add-special] [--parse-special]\n"
               "                      (--jsonl | --text TEXT | --decode)\n"
               "  PATH: tokenizer.json, a Hugging Face model directory, or a .gguf file\n"
               "  --jsonl   read {\"text\": ...} lines on stdin, write {\"ids\": [...]} lines\n"
               "  --decode  read {\"ids\": [...]} lines on stdin, write {\"text\": ...} lines\n");
}

static int parse_args(int argc, char **argv, struct tok_args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--tokenizer") && i + 1 < argc)
            a->path = argv[++i];
        else if (!strcmp(s, "--text") && i + 1 < argc)
            a->text = argv[++i];
        else if (!strcmp(s, "--add-special"))
            a->add_special = true;
        else if (!strcmp(s, "--parse-special"))
            a->parse_special = true;
        else if (!strcmp(s, "--jsonl"))
            a->jsonl = true;
        else if (!strcmp(s, "--decode"))
            a->decode = true;
        else if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            usage(stdout);
            exit(TY_CLI_EXIT_OK);
        } else {
            fprintf(stderr, "tycho tokenize: unknown or incomplete option '%s'\n", s);
            return TY_EINVAL;
        }
    }
    if (!a->path || (a->jsonl + a->decode + (a->text != NULL)) != 1) {
        usage(stderr);
        return TY_EINVAL;
    }
    return 0;
}

static bool is_gguf(const char *path)
{
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

int ty__cli_open_tokenizer(const char *path, ty_tokenizer_t **tok, char *eb, size_t el)
{
    if (!is_gguf(path))
        return ty_tokenizer_load_json(tok, path, eb, el);
    ty_gguf_t *g;
    int rc = ty_gguf_open(&g, path, eb, el);
    if (rc)
        return rc;
    rc = ty_tokenizer_new_from_gguf(tok, g, eb, el);
    ty_gguf_close(g);
    return rc;
}

/* Encode and print {"ids":[...]}. */
static int print_ids(const ty_tokenizer_t *tok, const struct tok_args *a, const char *s, size_t n)
{
    uint32_t local[256];
    uint32_t *ids = local;
    int k = ty_tokenizer_encode(tok, s, n, a->add_special, a->parse_special, ids, 256);
    if (k > 256) {
        ids = malloc(sizeof(uint32_t) * (size_t)k);
        if (!ids)
            return TY_ENOMEM;
        k = ty_tokenizer_encode(tok, s, n, a->add_special, a->parse_special, ids, (size_t)k);
    }
    if (k >= 0) {
        fputs("{\"ids\":[", stdout);
        for (int i = 0; i < k; i++)
            printf(i ? ",%u" : "%u", ids[i]);
        fputs("]}\n", stdout);
    }
    if (ids != local)
        free(ids);
    return k < 0 ? k : 0;
}

static int decode_line(const ty_tokenizer_t *tok, json_t *arr)
{
    size_t n = json_array_size(arr), i;
    uint32_t *ids = malloc(sizeof(uint32_t) * (n ? n : 1));
    json_t *v;
    if (!ids)
        return TY_ENOMEM;
    json_array_foreach(arr, i, v)
    {
        json_int_t x = json_integer_value(v);
        if (!json_is_integer(v) || x < 0 || x >= ty_tokenizer_n_vocab(tok)) {
            free(ids);
            return TY_EINVAL;
        }
        ids[i] = (uint32_t)x;
    }
    int len = ty_tokenizer_decode(tok, ids, n, true, NULL, 0);
    char *buf = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (buf) {
        ty_tokenizer_decode(tok, ids, n, true, buf, (size_t)len + 1);
        json_t *o = json_pack("{s:s%}", "text", buf, (size_t)len);
        char *dump = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        if (dump)
            puts(dump);
        free(dump);
        json_decref(o);
    }
    free(buf);
    free(ids);
    return len < 0 ? len : 0;
}

static int run_lines(const ty_tokenizer_t *tok, const struct tok_args *a)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    int rc = 0;
    while ((got = getline(&line, &cap, stdin)) > 0) {
        lineno++;
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &je);
        json_t *f = o ? json_object_get(o, a->decode ? "ids" : "text") : NULL;
        if (a->decode ? !json_is_array(f) : !json_is_string(f)) {
            fprintf(stderr, "tycho tokenize: stdin line %ld: %s\n", lineno,
                    o ? (a->decode ? "no \"ids\" array" : "no \"text\" string") : je.text);
            rc = TY_EPARSE;
        } else if (a->decode) {
            rc = decode_line(tok, f);
        } else {
            rc = print_ids(tok, a, json_string_value(f), json_string_length(f));
        }
        json_decref(o);
        if (rc) {
            if (rc != TY_EPARSE)
                fprintf(stderr, "tycho tokenize: stdin line %ld: %s\n", lineno, ty_strerror(rc));
            break;
        }
    }
    free(line);
    fflush(stdout);
    return rc;
}

static int run_tokenize(int argc, char **argv)
{
    struct tok_args a = {0};
    char eb[512] = "";
    ty_tokenizer_t *tok;
    if (parse_args(argc, argv, &a))
        return TY_CLI_EXIT_USAGE;
    int rc = ty__cli_open_tokenizer(a.path, &tok, eb, sizeof(eb));
    if (rc) {
        fprintf(stderr, "tycho tokenize: %s: %s\n", a.path, eb[0] ? eb : ty_strerror(rc));
        return TY_CLI_EXIT_FAIL;
    }
    if (a.text)
        rc = print_ids(tok, &a, a.text, strlen(a.text));
    else
        rc = run_lines(tok, &a);
    ty_tokenizer_free(tok);
    return rc ? TY_CLI_EXIT_FAIL : TY_CLI_EXIT_OK;
}

const struct ty_cli_command ty_cli_cmd_tokenize = {
    "tokenize", "text to token ids (JSON lines) with a GGUF or Hugging Face tokenizer",
    run_tokenize};
