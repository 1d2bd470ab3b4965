#include "tycho/errors.h"

#include <string.h>

const char *ty_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
#define TY__ERR_MSG(name, value, msg)                                                             \
    case value:                                                                                   \
        return msg;
        TY_ERRNO_MAP(TY__ERR_MSG)
#undef TY__ERR_MSG
    default:
        break;
    }
    if (err < 0 && err > -4096) {
        /* strerror() of glibc returns static strings for known values. */
        return strerror(-err);
    }
    return "unknown error";
}

const char *ty_err_name(int err)
{
    switch (err) {
    case 0:
        return "OK";
#define TY__ERR_NAME(name, value, msg)                                                            \
    case value:                                                                                   \
        return #name;
        TY_ERRNO_MAP(TY__ERR_NAME)
#undef TY__ERR_NAME
    default:
        return "UNKNOWN";
    }
}

int ty_errno(void)
{
    return errno > 0 ? -errno : TY_EIO;
}
