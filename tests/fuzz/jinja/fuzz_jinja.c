/* libFuzzer target: the Jinja parser on arbitrary bytes; whatever parses is rendered with a small
 * fixed conversation (tool calls, tools, add_generation_prompt) under small limits. Checks: no
 * crash, no leak, and a failed call returns a negative code with a message and no output. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja-impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *vars;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "broken promise: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!vars)
        vars = json_loads(
            "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
            "\"content\":\"hi \\u00e9\"},{\"role\":\"assistant\",\"content\":null,"
            "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
            "{\"x\":1.5,\"y\":[true,null]}}}]},{\"role\":\"tool\",\"content\":\"42\"}],"
            "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
            "{\"type\":\"object\"}}}],\"add_generation_prompt\":true,\"bos_token\":\"<s>\"}",
            0, NULL);
    ty_jinja_t *t = NULL;
    struct ty_jinja_error err = {0};
    int rc = ty_jinja_parse(&t, (const char *)data, size, &err);
    if (rc) {
        check(rc < 0 && err.msg[0] && t == NULL, "parse failure has a code and message");
        return 0;
    }
    struct jj_limits lim = {.max_out = 1 << 16, .max_mem = 8 << 20, .max_iter = 20000,
                            .max_depth = 30};
    char *out = NULL;
    size_t n = 0;
    rc = ty__jinja_render_ex(t, vars, &lim, &out, &n, &err);
    if (rc) {
        check(rc < 0 && err.msg[0] && out == NULL, "render failure has a code and message");
    } else {
        check(out && strlen(out) <= n && n <= lim.max_out, "output within limits");
        free(out);
    }
    ty_jinja_free(t);
    return 0;
}
