/* Tycho error codes.
 *
 * Functions that act return int: 0 on success or a negative TY_E* code. OS failures are the
 * negated errno (TY_ENOMEM == -ENOMEM); project codes count down from -10000. One X-macro list
 * below generates the enum, ty_strerror() and ty_err_name(), so they never disagree.
 * All functions here are pure and thread-safe.
 */
#ifndef TYCHO_ERRORS_H
#define TYCHO_ERRORS_H

#include <errno.h>

/* XX(name, value, message) */
#define TY_ERRNO_MAP(XX)                                                                          \
    XX(EPERM, -EPERM, "operation not permitted")                                                  \
    XX(ENOENT, -ENOENT, "no such file or directory")                                              \
    XX(EINTR, -EINTR, "interrupted system call")                                                  \
    XX(EIO, -EIO, "i/o error")                                                                    \
    XX(EBADF, -EBADF, "bad file descriptor")                                                      \
    XX(EAGAIN, -EAGAIN, "resource temporarily unavailable")                                       \
    XX(ENOMEM, -ENOMEM, "out of memory")                                                          \
    XX(EACCES, -EACCES, "permission denied")                                                      \
    XX(EFAULT, -EFAULT, "bad address")                                                            \
    XX(EBUSY, -EBUSY, "resource busy")                                                            \
    XX(EEXIST, -EEXIST, "already exists")                                                         \
    XX(ENODEV, -ENODEV, "no such device")                                                         \
    XX(EINVAL, -EINVAL, "invalid argument")                                                       \
    XX(EMFILE, -EMFILE, "too many open files")                                                    \
    XX(EFBIG, -EFBIG, "file too large")                                                           \
    XX(ENOSPC, -ENOSPC, "no space left on device")                                                \
    XX(EPIPE, -EPIPE, "broken pipe")                                                              \
    XX(ERANGE, -ERANGE, "value out of range")                                                     \
    XX(ENAMETOOLONG, -ENAMETOOLONG, "name too long")                                              \
    XX(ENOSYS, -ENOSYS, "function not implemented")                                               \
    XX(ENODATA, -ENODATA, "no data available")                                                    \
    XX(EPROTO, -EPROTO, "protocol error")                                                         \
    XX(EBADMSG, -EBADMSG, "bad message")                                                          \
    XX(EOVERFLOW, -EOVERFLOW, "value too large for defined data type")                            \
    XX(EILSEQ, -EILSEQ, "illegal byte sequence")                                                  \
    XX(EMSGSIZE, -EMSGSIZE, "message too long")                                                   \
    XX(ENOTSUP, -ENOTSUP, "operation not supported")                                              \
    XX(EADDRINUSE, -EADDRINUSE, "address already in use")                                         \
    XX(ENETUNREACH, -ENETUNREACH, "network is unreachable")                                       \
    XX(ECONNABORTED, -ECONNABORTED, "connection aborted")                                         \
    XX(ECONNRESET, -ECONNRESET, "connection reset by peer")                                       \
    XX(ENOTCONN, -ENOTCONN, "socket is not connected")                                            \
    XX(ETIMEDOUT, -ETIMEDOUT, "operation timed out")                                              \
    XX(ECONNREFUSED, -ECONNREFUSED, "connection refused")                                         \
    XX(EHOSTUNREACH, -EHOSTUNREACH, "host is unreachable")                                        \
    XX(EALREADY, -EALREADY, "operation already in progress")                                      \
    XX(ECANCELED, -ECANCELED, "operation canceled")                                               \
    XX(ESHUTDOWN, -ESHUTDOWN, "shutting down")                                                    \
    XX(ECONFIG, -10000, "invalid configuration")                                                  \
    XX(EPARSE, -10001, "parse error")                                                             \
    XX(EFORMAT, -10002, "malformed or unsupported file format")                                   \
    XX(ECHECKSUM, -10003, "checksum mismatch")                                                    \
    XX(ECUDA, -10004, "CUDA error")                                                               \
    XX(ERPC, -10005, "RPC error")                                                                 \
    XX(EREMOTE, -10006, "the peer reported an error")                                             \
    XX(EREJECTED, -10007, "request rejected by admission control")                                \
    XX(ENOTFOUND, -10008, "not found")                                                            \
    XX(ELEASE, -10009, "lease expired or not held")                                               \
    XX(ESTALE, -10010, "stale metadata or leader")                                                \
    XX(ETOKENIZER, -10011, "tokenizer error")                                                     \
    XX(ENOCAPACITY, -10012, "no capacity left")                                                   \
    XX(EOUTOFRANGE, -10013, "access outside registered memory")                                   \
    XX(EUNAVAIL, -10014, "no node available")

enum ty_errno {
#define TY__ERR_ENUM(name, value, msg) TY_##name = (value),
    TY_ERRNO_MAP(TY__ERR_ENUM)
#undef TY__ERR_ENUM
};

/* Human-readable message for an error code; never NULL. Unknown negative values fall back to
 * strerror(-err) text when they are errno values, else "unknown error". Thread-safe. */
const char *ty_strerror(int err);

/* Symbolic name ("ETIMEDOUT", "ECONFIG"); never NULL ("UNKNOWN" for unlisted codes). */
const char *ty_err_name(int err);

/* Negated errno of the last failed libc call, never 0 (so callers can `return ty_errno();`). */
int ty_errno(void);

#endif
