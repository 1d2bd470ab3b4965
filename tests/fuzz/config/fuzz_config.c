/* libFuzzer target for the config loader: arbitrary bytes as a YAML file for each daemon's
 * table (and the scheduler's, for lists of structs), and as the value of a scalar flag and of
 * a list flag. Whatever loads must dump to YAML that loads
 * back and dumps to the same text (abort otherwise); nothing may crash, leak or hang.
 * Run: fuzz_config -max_total_time=20 CORPUS configs tests/data/config
 */
#include "tycho/config.h"
#include "tycho/conductor.h"
#include "tycho/node.h"
#include "tycho/serve_local.h"
#include "tycho/log.h"
#include "tycho/sched.h"
#include "tycho/store_config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *dump(ty_config_t *cfg)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f || ty_config_dump(cfg, f) != 0)
        abort();
    fclose(f);
    return text;
}

/* A loaded config must survive dump -> load -> dump unchanged. */
static void check_round_trip(const struct ty_config_struct *root, ty_config_t *cfg)
{
    char *a = dump(cfg);
    void *data = calloc(1, root->size);
    ty_config_t *again = NULL;
    struct ty_config_error err;
    const struct ty_config_opts o = {.root = root, .data = data};
    if (ty_config_new(&again, &o, &err) != 0)
        abort();
    if (ty_config_load_string(again, a, strlen(a), "dump", &err) != 0) {
        fprintf(stderr, "dump does not load back: %s\n---\n%s---\n", err.msg, a);
        abort();
    }
    char *b = dump(again);
    if (strcmp(a, b) != 0) {
        fprintf(stderr, "dump changed on reload:\n%s---\n%s---\n", a, b);
        abort();
    }
    free(a);
    free(b);
    ty_config_free(again);
    free(data);
}

static void run(const struct ty_config_struct *root, const uint8_t *in, size_t size,
                const char *arg_prefix)
{
    void *data = calloc(1, root->size);
    ty_config_t *cfg = NULL;
    struct ty_config_error err;
    const struct ty_config_opts o = {.root = root, .data = data};
    if (ty_config_new(&cfg, &o, &err) != 0)
        abort();
    int rc;
    if (arg_prefix) {
        size_t plen = strlen(arg_prefix), n = strnlen((const char *)in, size);
        char *arg = malloc(plen + n + 1);
        memcpy(arg, arg_prefix, plen);
        memcpy(arg + plen, in, n);
        arg[plen + n] = '\0';
        rc = ty_config_set_arg(cfg, arg, &err);
        free(arg);
    } else {
        rc = ty_config_load_string(cfg, (const char *)in, size, "fuzz.yaml", &err);
    }
    if (rc == 0)
        check_round_trip(root, cfg);
    else if (!err.msg[0] || strchr(err.msg, '\n'))
        abort(); /* every failure has a one-line message */
    ty_config_free(cfg);
    free(data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ty_log_set_level(TY_LOG_LEVEL_ERROR);
    run(&ty_conductor_config_table, data, size, NULL);
    run(&ty_serve_config_table, data, size, NULL);
    run(&ty_node_config_table, data, size, NULL);
    run(&ty_store_config_table, data, size, NULL);
    run(&ty_sched_config_table, data, size, NULL);
    run(&ty_conductor_config_table, data, size, "--listen_port=");
    run(&ty_conductor_config_table, data, size, "--api_keys=");
    run(&ty_serve_config_table, data, size, "--engine.kv_pages=");
    run(&ty_store_config_table, data, size, "--dram_bytes=");
    return 0;
}
