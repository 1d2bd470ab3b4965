#include "tycho/log.h"

#include "tycho/clock.h"
#include "tycho/errors.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static _Atomic int g_level = -1; /* -1: not yet read from the environment */
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

static void stderr_sink(enum ty_log_level level, const char *subsys, const char *msg,
                        uint64_t suppressed, void *arg)
{
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
