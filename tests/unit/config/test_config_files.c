/* Every malformed file in tests/data/config/ gives one error that names the file, the line the
 * file's own "# expect:" header states (written by hand) and the field; every example in
 * configs/, configs/cluster/ and configs/store/ loads cleanly with the role its "# role:"
 * header names. The roles and tables are those of `tycho check-config` (src/cli/), that is
 * the tables the daemons themselves load.
 */
#include "check_config.h"

#include "tycho/config.h"
#include "tycho/daemon.h"
#include "tycho/errors.h"

#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

struct expect {
    char role[32];
    int line;
    char field[128];
};

static int read_header(const char *path, struct expect *e)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[256];
    memset(e, 0, sizeof(*e));
    e->line = -1;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "# role: %31s", e->role) == 1)
            continue;
        if (sscanf(line, "# expect: line %d, field %127s", &e->line, e->field) >= 1)
            continue;
    }
    fclose(f);
    return e->role[0] ? 0 : -1;
}

static int load(const char *path, const char *role_name, struct ty_config_error *err)
{
    const struct ty_cli_config_role *role = ty_cli_config_role_find(role_name);
    if (!role)
        fail_msg("unknown role '%s'", role_name);
    void *data = calloc(1, role->root->size);
    ty_config_t *cfg = NULL;
    int rc = ty_daemon_load_config(&cfg, role->root, data, path, NULL, 0, err);
    ty_config_free(cfg);
    free(data);
    return rc;
}

static int is_yaml(const struct dirent *d)
{
    size_t n = strlen(d->d_name);
    return n > 5 && strcmp(d->d_name + n - 5, ".yaml") == 0;
}

static void test_malformed(void **state)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/tests/data/config", getenv("TYCHO_SOURCE_DIR"));
    struct dirent **names;
    int n = scandir(dir, &names, is_yaml, alphasort);
    assert_true(n >= 10);
    for (int i = 0; i < n; i++) {
        char path[1400], want[1600];
        struct expect e;
        struct ty_config_error err;
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
        assert_int_equal(read_header(path, &e), 0);
        int rc = load(path, e.role, &err);
        printf("%-26s -> %s\n", names[i]->d_name, err.msg);
        if (rc == 0)
            fail_msg("%s loaded without error", path);
        assert_non_null(strstr(err.msg, path));
        if (e.line > 0) {
            snprintf(want, sizeof(want), "%s:%d:", path, e.line);
            if (!strstr(err.msg, want))
                fail_msg("%s: expected line %d in: %s", names[i]->d_name, e.line, err.msg);
            assert_int_equal(err.line, e.line);
        }
        if (e.field[0]) {
            snprintf(want, sizeof(want), ": %s: ", e.field);
            if (!strstr(err.msg, want) || strcmp(err.field, e.field) != 0)
                fail_msg("%s: expected field %s in: %s", names[i]->d_name, e.field, err.msg);
        }
        assert_null(strchr(err.msg, '\n')); /* one line */
        free(names[i]);
    }
    free(names);
}

static void check_examples(const char *sub, int *n_files)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/configs%s", getenv("TYCHO_SOURCE_DIR"), sub);
    struct dirent **names;
    int n = scandir(dir, &names, is_yaml, alphasort);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++) {
        char path[1400];
        struct expect e;
        struct ty_config_error err;
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]->d_name);
        if (read_header(path, &e) != 0)
            fail_msg("%s: no '# role:' header", path);
        if (load(path, e.role, &err) != 0)
            fail_msg("%s: %s", path, err.msg);
        free(names[i]);
    }
    free(names);
    *n_files += n;
}

static void test_examples(void **state)
{
    int n = 0;
    check_examples("", &n);
    check_examples("/cluster", &n);
    check_examples("/store", &n);
    assert_true(n >= 8);
}

static void test_roles(void **state)
{
    /* one table per daemon: the two node daemons share theirs, the others differ */
    const struct ty_cli_config_role *c = ty_cli_config_role_find("conductor"),
                                    *s = ty_cli_config_role_find("serve"),
                                    *p = ty_cli_config_role_find("prefill"),
                                    *d = ty_cli_config_role_find("decode"),
                                    *st = ty_cli_config_role_find("store");
    assert_true(c && s && p && d && st);
    assert_ptr_equal(p->root, d->root);
    assert_true(c->root != s->root && c->root != p->root && st->root != p->root);
    assert_null(ty_cli_config_role_find("node"));
}

int main(void)
{
    if (!getenv("TYCHO_SOURCE_DIR"))
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_examples),
        cmocka_unit_test(test_roles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
