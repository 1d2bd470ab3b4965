#include "tycho/log.h"

#include "tycho/clock.h"
#include "tycho/errors.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static _Atomic int g_level = -1; /* -1: not yet read from the environment */
static _Atomic int g_format = -1; /* enum ty_log_format; -1: not yet read from the environment */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static ty_log_sink_cb g_sink;
static void *g_sink_arg;
static uint32_t g_burst = 10;
static uint32_t g_interval_ms = 1000;

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

const char *ty_log_level_name(enum ty_log_level level)
{
    return (unsigned)level < 5 ? level_names[level] : "?";
}

int ty_log_level_parse(const char *s, enum ty_log_level *out)
{
    for (int i = 0; i < 5; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (enum ty_log_level)i;
            return 0;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = TY_LOG_LEVEL_WARN;
        return 0;
    }
    return TY_EINVAL;
}

enum ty_log_level ty_log_get_level(void)
{
    int lv = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (lv < 0) {
        enum ty_log_level parsed = TY_LOG_LEVEL_INFO;
        const char *env = getenv("TYCHO_LOG_LEVEL");
        if (env && ty_log_level_parse(env, &parsed) != 0)
            parsed = TY_LOG_LEVEL_INFO;
        lv = (int)parsed;
        atomic_store(&g_level, lv);
    }
    return (enum ty_log_level)lv;
}

void ty_log_set_level(enum ty_log_level level)
{
    atomic_store(&g_level, (int)level);
}

static const char *const format_names[] = {"text", "json"};

const char *ty_log_format_name(enum ty_log_format f)
{
    return (unsigned)f < 2 ? format_names[f] : "?";
}

int ty_log_format_parse(const char *s, enum ty_log_format *out)
{
    for (int i = 0; i < 2; i++) {
        if (s && !strcmp(s, format_names[i])) {
            *out = (enum ty_log_format)i;
            return 0;
        }
    }
    return TY_EINVAL;
}

enum ty_log_format ty_log_get_format(void)
{
    int f = atomic_load_explicit(&g_format, memory_order_relaxed);
    if (f < 0) {
        enum ty_log_format parsed = TY_LOG_FORMAT_TEXT;
        const char *env = getenv("TYCHO_LOG_FORMAT");
        if (env && ty_log_format_parse(env, &parsed) != 0)
            parsed = TY_LOG_FORMAT_TEXT;
        f = (int)parsed;
        atomic_store(&g_format, f);
    }
    return (enum ty_log_format)f;
}

void ty_log_set_format(enum ty_log_format f)
{
    atomic_store(&g_format, (int)f);
}

void ty_log_set_sink(ty_log_sink_cb sink, void *arg)
{
    pthread_mutex_lock(&g_lock);
    g_sink = sink;
    g_sink_arg = arg;
    pthread_mutex_unlock(&g_lock);
}

void ty_log_set_ratelimit(uint32_t burst, uint32_t interval_ms)
{
    pthread_mutex_lock(&g_lock);
    g_burst = burst;
    g_interval_ms = interval_ms ? interval_ms : 1000;
    pthread_mutex_unlock(&g_lock);
}

/* syslog priorities, for journald's stream parser */
static const int level_prio[] = {3, 4, 6, 7, 7};

/* Length of the valid UTF-8 sequence at p (of n bytes), 0 if invalid. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
    size_t k = p[0] < 0x80 ? 1 : (p[0] & 0xE0) == 0xC0 ? 2 : (p[0] & 0xF0) == 0xE0 ? 3
             : (p[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (!k || k > n || (k == 2 && p[0] < 0xC2) || (k == 4 && p[0] > 0xF4))
        return 0;
    for (size_t i = 1; i < k; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return k;
}

/* Append s as a JSON string body (escaped; invalid UTF-8 bytes become U+FFFD). */
static void json_str(char *out, size_t cap, size_t *len, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n && *len + 8 < cap;) {
        unsigned char ch = p[i];
        size_t k = utf8_seq(p + i, n - i);
        if (ch == '"' || ch == '\\') {
            out[(*len)++] = '\\';
            out[(*len)++] = (char)ch;
        } else if (ch == '\n') {
            out[(*len)++] = '\\', out[(*len)++] = 'n';
        } else if (ch < 0x20 || ch == 0x7f) {
            *len += (size_t)snprintf(out + *len, cap - *len, "\\u%04x", ch);
        } else if (!k) {
            *len += (size_t)snprintf(out + *len, cap - *len, "\\ufffd");
            k = 1;
        } else if (*len + k + 1 < cap) {
            memcpy(out + *len, p + i, k);
            *len += k;
        } else {
            break;
        }
        i += k ? k : 1;
    }
    out[*len] = 0;
}

/* printf into out at *len, never past cap (a cut line stays within the buffer) */
static void put(char *out, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *out, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(out + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (w > 0)
        *len = *len + (size_t)w < cap ? *len + (size_t)w : cap - 1;
}

/* One JSON object per line: time, level, subsystem, process, message, and where the message
 * names a request as "request N [ID]" (the Conductor's and nodes' convention) its request id
 * N and the client's x-request-id ID as fields of their own. Strings are cut to fit the
 * line's buffer rather than the line to fit (it stays valid JSON). */
static void json_line(enum ty_log_level level, const char *subsys, const char *msg,
                      uint64_t suppressed)
{
    char out[8192];
    const size_t cap = sizeof(out) - 64; /* room for the fixed tail */
    size_t len = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    put(out, cap, &len,
        "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\",\"subsystem\":\"",
        tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
        ts.tv_nsec / 1000000, level_names[level]);
    json_str(out, cap / 8, &len, subsys, strlen(subsys));
    put(out, cap, &len, "\",\"process\":\"");
    json_str(out, cap / 4, &len, program_invocation_short_name,
             strlen(program_invocation_short_name));
    put(out, cap, &len, "\",\"message\":\"");
    json_str(out, cap - 512, &len, msg, strlen(msg));
    put(out, sizeof(out), &len, "\"");
    const char *r = strstr(msg, "request ");
    if (r) {
        char *end;
        unsigned long long id = strtoull(r + 8, &end, 10);
        const char *close = end > r + 8 && end[0] == ' ' && end[1] == '[' ? strchr(end + 2, ']')
                                                                          : NULL;
        if (end > r + 8)
            put(out, sizeof(out), &len, ",\"request\":%llu", id);
        if (close && close > end + 2 && close - end - 2 <= 128) {
            put(out, sizeof(out), &len, ",\"request_id\":\"");
            json_str(out, sizeof(out) - 32, &len, end + 2, (size_t)(close - end - 2));
            put(out, sizeof(out), &len, "\"");
        }
    }
    if (suppressed)
        put(out, sizeof(out), &len, ",\"suppressed\":%llu", (unsigned long long)suppressed);
    fprintf(stderr, "%.*s}\n", (int)len, out);
}

static void stderr_sink(enum ty_log_level level, const char *subsys, const char *msg,
                        uint64_t suppressed, void *arg)
{
    (void)arg;
    if (ty_log_get_format() == TY_LOG_FORMAT_JSON) {
        json_line(level, subsys, msg, suppressed);
        return;
    }
    static int journal = -1;
    if (journal < 0)
        journal = getenv("JOURNAL_STREAM") != NULL;
    char sup[48] = "";
    if (suppressed)
        snprintf(sup, sizeof(sup), " (%llu similar suppressed)", (unsigned long long)suppressed);
    if (journal) {
        fprintf(stderr, "<%d>[%s] %s%s\n", level_prio[level], subsys, msg, sup);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c [%s] %s%s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            "EWIDT"[level], subsys, msg, sup);
}

/* Returns true when the line may be emitted; *suppressed gets the count dropped before it. */
static bool site_admit(struct ty_log_site *site, uint64_t *suppressed)
{
    *suppressed = 0;
    if (!site || g_burst == 0)
        return true;
    uint64_t now = ty_clock_ms();
    if (now - site->window_start_ms >= g_interval_ms) {
        *suppressed = site->suppressed;
        site->window_start_ms = now;
        site->count = 0;
        site->suppressed = 0;
    }
    if (site->count >= g_burst) {
        site->suppressed++;
        return false;
    }
    site->count++;
    return true;
}

void ty_log_vwrite(struct ty_log_site *site, enum ty_log_level level, const char *subsys,
                   const char *fmt, va_list ap)
{
    if ((unsigned)level > TY_LOG_LEVEL_TRACE)
        level = TY_LOG_LEVEL_TRACE;
    char buf[2048];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    pthread_mutex_lock(&g_lock);
    uint64_t suppressed;
    if (site_admit(site, &suppressed)) {
        ty_log_sink_cb sink = g_sink ? g_sink : stderr_sink;
        sink(level, subsys ? subsys : "-", buf, suppressed, g_sink_arg);
    }
    pthread_mutex_unlock(&g_lock);
}

void ty_log_write(struct ty_log_site *site, enum ty_log_level level, const char *subsys,
                  const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ty_log_vwrite(site, level, subsys, fmt, ap);
    va_end(ap);
}

void ty__assert_fail(const char *expr, const char *file, int line, const char *func)
{
    fprintf(stderr, "tycho: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
    fflush(stderr);
    abort();
}
