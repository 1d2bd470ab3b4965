#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tycho/errors.h"

#include <string.h>

static void test_names_and_messages(void **state)
{
    assert_string_equal(ty_err_name(TY_ETIMEDOUT), "ETIMEDOUT");
    assert_string_equal(ty_err_name(TY_ECONFIG), "ECONFIG");
    assert_string_equal(ty_err_name(0), "OK");
    assert_string_equal(ty_err_name(-123456), "UNKNOWN");
    assert_int_equal(TY_ENOMEM, -ENOMEM);
    assert_int_equal(TY_ECONFIG, -10000);
    assert_string_equal(ty_strerror(TY_ECHECKSUM), "checksum mismatch");
    /* An errno outside the list still gets libc's text. */
    assert_string_equal(ty_strerror(-ENOTDIR), strerror(ENOTDIR));
    assert_string_equal(ty_strerror(-999999), "unknown error");
}

static void test_codes_unique(void **state)
{
    static const int codes[] = {
#define X(name, value, msg) value,
        TY_ERRNO_MAP(X)
#undef X
    };
    size_t n = sizeof(codes) / sizeof(codes[0]);
    for (size_t i = 0; i < n; i++) {
        assert_true(codes[i] < 0);
        for (size_t j = i + 1; j < n; j++)
            assert_int_not_equal(codes[i], codes[j]);
    }
}

static void test_errno_helper(void **state)
{
    errno = EACCES;
    assert_int_equal(ty_errno(), TY_EACCES);
    errno = 0;
    assert_true(ty_errno() < 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_messages),
        cmocka_unit_test(test_codes_unique),
        cmocka_unit_test(test_errno_helper),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
