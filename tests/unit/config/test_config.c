/* Config API on hand-written YAML: every type, nesting, lists, defaults, precedence
 * (defaults < file < environment < flags), dump -> load round trip, reload, table checks.
 * Expected values are computed by hand from the YAML text (64M = 67108864, 1.5s = 1.5e9 ns).
 */
#include "tycho/config.h"
#include "tycho/errors.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

struct t_class {
    char *name;
    uint32_t ttft_ms;
    double tbt_ms;
    bool strict;
};

struct t_slo {
    uint32_t ttft_ms;
    double tbt_ms;
};

struct t_cfg {
    bool flag;
    int32_t offset;
    uint16_t port;
    double ratio;
    char *name;
    int mode;
    uint64_t bytes;
    uint64_t timeout_ns;
    int8_t small;
    struct t_slo slo;
    char **tags;
    uint32_t n_tags;
    struct t_class *classes;
    uint32_t n_classes;
    uint64_t *sizes;
    uint32_t n_sizes;
    char *req;
};

static const char *const modes[] = {"fast", "slow", "balanced", NULL};

static const struct ty_config_field class_fields[] = {
    {.key = "name", .type = TY_CONFIG_STRING, TY_CONFIG_AT(struct t_class, name),
     .flags = TY_CONFIG_REQUIRED, .help = "class name"},
    {.key = "ttft_ms", .type = TY_CONFIG_UINT, TY_CONFIG_AT(struct t_class, ttft_ms),
     .def = "1000", .min = "1", .help = "TTFT SLO"},
    {.key = "tbt_ms", .type = TY_CONFIG_DOUBLE, TY_CONFIG_AT(struct t_class, tbt_ms),
     .def = "50", .min = "0.5", .help = "TBT SLO"},
    {.key = "strict", .type = TY_CONFIG_BOOL, TY_CONFIG_AT(struct t_class, strict),
     .def = "false", .help = "reject instead of degrade"},
};
static const struct ty_config_struct class_struct =
    TY_CONFIG_STRUCT("slo class", struct t_class, class_fields);

static const struct ty_config_field slo_fields[] = {
    {.key = "ttft_ms", .type = TY_CONFIG_UINT, TY_CONFIG_AT(struct t_slo, ttft_ms), .def = "2000",
     .min = "1", .max = "600000", .flags = TY_CONFIG_RELOADABLE, .help = "TTFT SLO"},
    {.key = "tbt_ms", .type = TY_CONFIG_DOUBLE, TY_CONFIG_AT(struct t_slo, tbt_ms), .def = "100",
     .min = "0.1", .help = "TBT SLO"},
};
static const struct ty_config_struct slo_struct =
    TY_CONFIG_STRUCT("slo", struct t_slo, slo_fields);

#define T struct t_cfg
static const struct ty_config_field t_fields[] = {
    {.key = "flag", .type = TY_CONFIG_BOOL, TY_CONFIG_AT(T, flag), .def = "true", .help = "b"},
    {.key = "offset", .type = TY_CONFIG_INT, TY_CONFIG_AT(T, offset), .def = "-7", .min = "-100",
     .max = "100", .help = "i"},
    {.key = "port", .type = TY_CONFIG_UINT, TY_CONFIG_AT(T, port), .def = "8000", .min = "1",
     .help = "u"},
    {.key = "ratio", .type = TY_CONFIG_DOUBLE, TY_CONFIG_AT(T, ratio), .def = "0.25", .min = "0",
     .max = "1", .flags = TY_CONFIG_RELOADABLE, .help = "d"},
    {.key = "name", .type = TY_CONFIG_STRING, TY_CONFIG_AT(T, name), .def = "tycho", .help = "s"},
    {.key = "mode", .type = TY_CONFIG_ENUM, TY_CONFIG_AT(T, mode), .def = "balanced",
     .enum_names = modes, .help = "e"},
    {.key = "bytes", .type = TY_CONFIG_SIZE, TY_CONFIG_AT(T, bytes), .def = "64M", .help = "z"},
    {.key = "timeout", .type = TY_CONFIG_DURATION, TY_CONFIG_AT(T, timeout_ns), .def = "250ms",
     .help = "t"},
    {.key = "small", .type = TY_CONFIG_INT, TY_CONFIG_AT(T, small), .help = "int8"},
    {.key = "slo", .type = TY_CONFIG_SECTION, TY_CONFIG_AT(T, slo), .sub = &slo_struct,
     .help = "section"},
    {.key = "tags", .type = TY_CONFIG_LIST, .elem = TY_CONFIG_STRING,
     TY_CONFIG_LIST_AT(T, tags, n_tags), .def = "[a, b]", .max = "4",
     .flags = TY_CONFIG_RELOADABLE, .help = "list of strings"},
    {.key = "classes", .type = TY_CONFIG_LIST, .sub = &class_struct,
     TY_CONFIG_LIST_AT(T, classes, n_classes), .help = "list of structs"},
    {.key = "sizes", .type = TY_CONFIG_LIST, .elem = TY_CONFIG_SIZE,
     TY_CONFIG_LIST_AT(T, sizes, n_sizes), .help = "list of sizes"},
    {.key = "req", .type = TY_CONFIG_STRING, TY_CONFIG_AT(T, req), .flags = TY_CONFIG_REQUIRED,
     .help = "required"},
};
static const struct ty_config_struct t_root = TY_CONFIG_STRUCT("test", T, t_fields);
#undef T

static ty_config_t *new_cfg(struct t_cfg *c)
{
    ty_config_t *cfg = NULL;
    struct ty_config_error err;
    const struct ty_config_opts o = {.root = &t_root, .data = c};
    int rc = ty_config_new(&cfg, &o, &err);
    if (rc != 0)
        fail_msg("ty_config_new: %s", err.msg);
    return cfg;
}

static void load_ok(ty_config_t *cfg, const char *yaml)
{
    struct ty_config_error err;
    int rc = ty_config_load_string(cfg, yaml, strlen(yaml), "t.yaml", &err);
    if (rc != 0)
        fail_msg("load failed: %s", err.msg);
}

static void test_defaults(void **state)
{
    struct t_cfg c;
    ty_config_t *cfg = new_cfg(&c);
    assert_true(c.flag);
    assert_int_equal(c.offset, -7);
    assert_int_equal(c.port, 8000);
    assert_true(c.ratio == 0.25);
    assert_string_equal(c.name, "tycho");
    assert_int_equal(c.mode, 2);
    assert_int_equal(c.bytes, 67108864u);
    assert_int_equal(c.timeout_ns, 250000000u);
    assert_int_equal(c.slo.ttft_ms, 2000);
    assert_true(c.slo.tbt_ms == 100.0);
    assert_int_equal(c.n_tags, 2);
    assert_string_equal(c.tags[0], "a");
    assert_string_equal(c.tags[1], "b");
    assert_int_equal(c.n_classes, 0);
    assert_null(c.req);
    struct ty_config_error err;
    assert_int_equal(ty_config_finish(cfg, &err), TY_ECONFIG); /* req is required */
    assert_string_equal(err.field, "req");
    ty_config_free(cfg);
}

static const char *full_yaml =
    "flag: no\n"
    "offset: 0x10\n"
    "port: 9001\n"
    "ratio: 0.5\n"
    "name: \"h\\u00e9llo: world\"\n"
    "mode: fast\n"
    "bytes: 1.5K\n"
    "timeout: 1.5s\n"
    "small: -128\n"
    "slo:\n"
    "  ttft_ms: 300\n"
    "tags: [x, 'y z, longer than max', \"\"]\n"
    "classes:\n"
    "  - name: gold\n"
    "    ttft_ms: 100\n"
    "    strict: true\n"
    "  - {name: bronze, tbt_ms: 2.5}\n"
    "sizes: [1G, 512, 2K]\n"
    "req: here\n";

static void test_types_nesting_lists(void **state)
{
    struct t_cfg c;
    ty_config_t *cfg = new_cfg(&c);
    load_ok(cfg, full_yaml);
    struct ty_config_error err;
    assert_int_equal(ty_config_finish(cfg, &err), 0);
    assert_false(c.flag);
    assert_int_equal(c.offset, 16);
    assert_int_equal(c.port, 9001);
    assert_true(c.ratio == 0.5);
    assert_string_equal(c.name, "h\xc3\xa9llo: world");
    assert_int_equal(c.mode, 0);
    assert_int_equal(c.bytes, 1536);
    assert_int_equal(c.timeout_ns, 1500000000u);
    assert_int_equal(c.small, -128);
    assert_int_equal(c.slo.ttft_ms, 300);
    assert_true(c.slo.tbt_ms == 100.0); /* untouched sibling keeps its default */
    assert_int_equal(c.n_tags, 3);
    assert_string_equal(c.tags[1], "y z, longer than max"); /* max bounds the count */
    assert_string_equal(c.tags[2], "");
    assert_int_equal(c.n_classes, 2);
    assert_string_equal(c.classes[0].name, "gold");
    assert_int_equal(c.classes[0].ttft_ms, 100);
    assert_true(c.classes[0].tbt_ms == 50.0); /* entry default */
    assert_true(c.classes[0].strict);
    assert_string_equal(c.classes[1].name, "bronze");
    assert_int_equal(c.classes[1].ttft_ms, 1000);
    assert_true(c.classes[1].tbt_ms == 2.5);
    assert_false(c.classes[1].strict);
    assert_int_equal(c.n_sizes, 3);
    assert_int_equal(c.sizes[0], 1073741824u);
    assert_int_equal(c.sizes[1], 512);
    assert_int_equal(c.sizes[2], 2048);
    assert_string_equal(c.req, "here");
    ty_config_free(cfg);
}

static void test_precedence(void **state)
{
    struct t_cfg c;
    ty_config_t *cfg = new_cfg(&c);
    struct ty_config_error err;
    load_ok(cfg, "port: 1\nslo: {ttft_ms: 10, tbt_ms: 9}\nratio: 0.125\n");
    setenv("TYCHO_PORT", "2", 1);
    setenv("TYCHO_SLO_TTFT_MS", "20", 1);
    setenv("TYCHO_TAGS", "[e1, e2, e3]", 1);
    assert_int_equal(ty_config_load_env(cfg, &err), 0);
    unsetenv("TYCHO_PORT");
    unsetenv("TYCHO_SLO_TTFT_MS");
    unsetenv("TYCHO_TAGS");
    assert_int_equal(c.port, 2);
    assert_int_equal(c.slo.ttft_ms, 20);
    assert_true(c.slo.tbt_ms == 9.0); /* file value, no env for it */
    assert_int_equal(c.n_tags, 3);
    assert_int_equal(ty_config_set_arg(cfg, "--port=3", &err), 0);
    assert_int_equal(ty_config_set_arg(cfg, "--slo.ttft-ms=30", &err), 0);
    assert_int_equal(ty_config_set_arg(cfg, "--flag=false", &err), 0);
    assert_int_equal(ty_config_set_arg(cfg, "--flag", &err), 0); /* bare bool flag: true */
    assert_int_equal(ty_config_set_arg(cfg, "--name=a \"quoted\" \\ value", &err), 0);
    assert_int_equal(c.port, 3);
    assert_int_equal(c.slo.ttft_ms, 30);
    assert_true(c.flag);
    assert_true(c.ratio == 0.125);
    assert_string_equal(c.name, "a \"quoted\" \\ value");
    /* a flag naming no setting is reported, with the nearest one */
    assert_int_equal(ty_config_set_arg(cfg, "--prot=3", &err), TY_ENOTFOUND);
    assert_non_null(strstr(err.msg, "did you mean 'port'"));
    assert_int_equal(ty_config_set_arg(cfg, "--port=0", &err), TY_ECONFIG);
    assert_string_equal(err.msg, "command line: port: value 0 is below the minimum 1");
    assert_int_equal(c.port, 3); /* a failed layer changes nothing */
    ty_config_free(cfg);
}

static char *dump_to_string(ty_config_t *cfg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(ty_config_dump(cfg, f), 0);
    fclose(f);
    return buf;
}

static void test_dump_round_trip(void **state)
{
    struct t_cfg a, b;
    ty_config_t *ca = new_cfg(&a), *cb = new_cfg(&b);
    load_ok(ca, full_yaml);
    assert_int_equal(ty_config_set(ca, "ratio", "0.1", NULL, NULL), 0);
    assert_int_equal(ty_config_set(ca, "name", "line1\nline2 \"q\" #x", NULL, NULL), 0);
    char *text = dump_to_string(ca);
    load_ok(cb, text);
    assert_int_equal(b.flag, a.flag);
    assert_int_equal(b.offset, a.offset);
    assert_int_equal(b.port, a.port);
    assert_true(b.ratio == a.ratio);
    assert_string_equal(b.name, "line1\nline2 \"q\" #x");
    assert_int_equal(b.mode, a.mode);
    assert_int_equal(b.bytes, a.bytes);
    assert_int_equal(b.timeout_ns, a.timeout_ns);
    assert_int_equal(b.small, a.small);
    assert_int_equal(b.slo.ttft_ms, a.slo.ttft_ms);
    assert_int_equal(b.n_tags, a.n_tags);
    for (uint32_t i = 0; i < a.n_tags; i++)
        assert_string_equal(b.tags[i], a.tags[i]);
    assert_int_equal(b.n_classes, 2);
    assert_string_equal(b.classes[1].name, "bronze");
    assert_true(b.classes[1].tbt_ms == 2.5);
    assert_int_equal(b.n_sizes, 3);
    assert_int_equal(b.sizes[0], 1073741824u);
    assert_string_equal(b.req, "here");
    char *again = dump_to_string(cb);
    assert_string_equal(text, again);
    /* sizes and durations are dumped in their units */
    assert_non_null(strstr(text, "timeout: 1500ms\n"));
    assert_non_null(strstr(text, "bytes: 1536\n"));
    assert_non_null(strstr(text, "- 1G\n"));
    free(text);
    free(again);
    ty_config_free(ca);
    ty_config_free(cb);
}

static void test_error_places(void **state)
{
    struct t_cfg c;
    ty_config_t *cfg = new_cfg(&c);
    struct ty_config_error err;
    const char *y = "port: 9\nslo:\n  ttft_ms: 0\n";
    assert_int_equal(ty_config_load_string(cfg, y, strlen(y), "c.yaml", &err), TY_ECONFIG);
    assert_string_equal(err.msg, "c.yaml:3:3: slo.ttft_ms: value 0 is below the minimum 1");
    assert_int_equal(err.line, 3);
    assert_int_equal(err.col, 3);
    assert_int_equal(c.port, 8000); /* the whole document was refused */
    y = "classes:\n  - name: a\n  - ttft_ms: 5\n";
    assert_int_equal(ty_config_load_string(cfg, y, strlen(y), "c.yaml", &err), TY_ECONFIG);
    assert_string_equal(err.field, "classes[1]");
    assert_non_null(strstr(err.msg, "required key 'name'"));
    y = "small: 128\n";
    assert_int_equal(ty_config_load_string(cfg, y, strlen(y), "c.yaml", &err), TY_ECONFIG);
    assert_string_equal(err.field, "small");
    y = "mode: slw\n";
    assert_int_equal(ty_config_load_string(cfg, y, strlen(y), "c.yaml", &err), TY_ECONFIG);
    assert_non_null(strstr(err.msg, "did you mean 'slow'"));
    y = "tags: [1, 2, 3, 4, 5]\n";
    assert_int_equal(ty_config_load_string(cfg, y, strlen(y), "c.yaml", &err), TY_ECONFIG);
    assert_string_equal(err.field, "tags");
    y = "flag: maybe\n";
    assert_int_equal(ty_config_load_string(cfg, y, strlen(y), "c.yaml", &err), TY_ECONFIG);
    assert_int_equal(err.line, 1);
    y = "port: 08080\n"; /* leading zero: octal to C, decimal to people: refused */
    assert_int_equal(ty_config_load_string(cfg, y, strlen(y), "c.yaml", &err), TY_ECONFIG);
    y = "";
    assert_int_equal(ty_config_load_string(cfg, y, 0, "c.yaml", &err), 0);
    ty_config_free(cfg);
}

static void test_reload(void **state)
{
    struct t_cfg live, fresh;
    ty_config_t *cl = new_cfg(&live), *cf = new_cfg(&fresh);
    load_ok(cl, "port: 100\nratio: 0.5\nslo: {ttft_ms: 5}\n");
    load_ok(cf, "port: 200\nratio: 0.75\nslo: {ttft_ms: 6}\ntags: [r]\nname: other\n");
    unsigned n = 0;
    assert_int_equal(ty_config_reload(cl, cf, &n), 0);
    assert_int_equal(n, 3); /* ratio, slo.ttft_ms, tags */
    assert_true(live.ratio == 0.75);
    assert_int_equal(live.slo.ttft_ms, 6);
    assert_int_equal(live.n_tags, 1);
    assert_string_equal(live.tags[0], "r");
    assert_int_equal(live.port, 100);           /* not reloadable */
    assert_string_equal(live.name, "tycho");    /* not reloadable */
    ty_config_free(cf);
    assert_string_equal(live.tags[0], "r"); /* still owned by live after fresh is gone */
    ty_config_free(cl);
}

static void test_table_bugs(void **state)
{
    struct t_cfg c;
    static const struct ty_config_field bad[] = {
        {.key = "port", .type = TY_CONFIG_UINT, TY_CONFIG_AT(struct t_cfg, port), .def = "70000"},
    };
    static const struct ty_config_struct bad_root = TY_CONFIG_STRUCT("bad", struct t_cfg, bad);
    ty_config_t *cfg = NULL;
    struct ty_config_error err;
    const struct ty_config_opts o = {.root = &bad_root, .data = &c};
    assert_int_equal(ty_config_new(&cfg, &o, &err), TY_ECONFIG);
    assert_string_equal(err.field, "port");
    assert_null(cfg);
}

static void test_help(void **state)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ty_config_help(&t_root, f);
    fclose(f);
    assert_non_null(strstr(buf, "--slo.ttft_ms=uint"));
    assert_non_null(strstr(buf, "--mode=fast|slow|balanced"));
    assert_non_null(strstr(buf, "(default 250ms)"));
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),        cmocka_unit_test(test_types_nesting_lists),
        cmocka_unit_test(test_precedence),      cmocka_unit_test(test_dump_round_trip),
        cmocka_unit_test(test_error_places),    cmocka_unit_test(test_reload),
        cmocka_unit_test(test_table_bugs),      cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
