/* Logging: levels, subsystems, a pluggable sink, and rate-limiting of repeated messages.
 *
 * Every line goes to one sink; the default writes to stderr in a journald-friendly form
 * ("<6>" priority prefixes when JOURNAL_STREAM is set, else an ISO-8601 timestamp). The logger
 * is safe to call from any thread; the sink is called with an internal lock held, so a sink must
 * not log itself. Subsystem names are static strings chosen by the caller ("rpc", "engine").
 */
#ifndef TYCHO_LOG_H
#define TYCHO_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#define TY__NORETURN [[noreturn]]
#else
#define TY__NORETURN _Noreturn
#endif

enum ty_log_level {
    TY_LOG_LEVEL_ERROR = 0,
    TY_LOG_LEVEL_WARN = 1,
    TY_LOG_LEVEL_INFO = 2,
    TY_LOG_LEVEL_DEBUG = 3,
    TY_LOG_LEVEL_TRACE = 4,
};

/* A sink gets one formatted line (no trailing newline). `suppressed` counts repeats of the same
 * call site that were dropped by rate-limiting since the last emitted line of that site. */
typedef void (*ty_log_sink_cb)(enum ty_log_level level, const char *subsys, const char *msg,
                               uint64_t suppressed, void *arg);

/* Set the global level threshold (default INFO, or $TYCHO_LOG_LEVEL). */
void ty_log_set_level(enum ty_log_level level);
enum ty_log_level ty_log_get_level(void);

/* Parse "error|warn|info|debug|trace"; returns 0 or TY_EINVAL. */
int ty_log_level_parse(const char *s, enum ty_log_level *out);
const char *ty_log_level_name(enum ty_log_level level);

/* The stderr sink's line format: text (an ISO-8601 timestamp, or journald's "<N>" priority
 * prefix under JOURNAL_STREAM) or json (one object per line: time, level, subsystem, process,
 * message, and request / request_id when the message names a request as "request N [ID]").
 * Default text, or $TYCHO_LOG_FORMAT; daemons set it from their log_format setting. */
enum ty_log_format { TY_LOG_FORMAT_TEXT = 0, TY_LOG_FORMAT_JSON = 1 };
void ty_log_set_format(enum ty_log_format f);
enum ty_log_format ty_log_get_format(void);
int ty_log_format_parse(const char *s, enum ty_log_format *out); /* 0 or TY_EINVAL */
const char *ty_log_format_name(enum ty_log_format f);

/* Replace the sink; NULL restores the stderr sink. */
void ty_log_set_sink(ty_log_sink_cb sink, void *arg);

/* Rate limit per call site: at most `burst` lines per `interval_ms` (defaults 10 per 1000 ms);
 * burst 0 disables limiting. */
void ty_log_set_ratelimit(uint32_t burst, uint32_t interval_ms);

/* Per-call-site state for rate limiting; the TY_LOG macros declare one statically. */
struct ty_log_site {
    uint64_t window_start_ms;
    uint32_t count;
    uint64_t suppressed;
};

void ty_log_write(struct ty_log_site *site, enum ty_log_level level, const char *subsys,
                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void ty_log_vwrite(struct ty_log_site *site, enum ty_log_level level, const char *subsys,
                   const char *fmt, va_list ap) __attribute__((format(printf, 4, 0)));

#define TY_LOG(level, subsys, ...)                                                                \
    do {                                                                                          \
        if ((level) <= ty_log_get_level()) {                                                      \
            static struct ty_log_site ty__log_site;                                               \
            ty_log_write(&ty__log_site, (level), (subsys), __VA_ARGS__);                          \
        }                                                                                         \
    } while (0)

#define TY_LOG_ERROR(subsys, ...) TY_LOG(TY_LOG_LEVEL_ERROR, subsys, __VA_ARGS__)
#define TY_LOG_WARN(subsys, ...) TY_LOG(TY_LOG_LEVEL_WARN, subsys, __VA_ARGS__)
#define TY_LOG_INFO(subsys, ...) TY_LOG(TY_LOG_LEVEL_INFO, subsys, __VA_ARGS__)
#define TY_LOG_DEBUG(subsys, ...) TY_LOG(TY_LOG_LEVEL_DEBUG, subsys, __VA_ARGS__)
#define TY_LOG_TRACE(subsys, ...) TY_LOG(TY_LOG_LEVEL_TRACE, subsys, __VA_ARGS__)

/* Invariant check: logs the expression with file and line and aborts. Not for input validation. */
#define TY_ASSERT(cond)                                                                           \
    do {                                                                                          \
        if (!(cond))                                                                              \
            ty__assert_fail(#cond, __FILE__, __LINE__, __func__);                                 \
    } while (0)

TY__NORETURN void ty__assert_fail(const char *expr, const char *file, int line,
                                  const char *func);

#ifdef __cplusplus
}
#endif

#endif
