#include "tycho/clock.h"

#include <errno.h>
#include <time.h>

static uint64_t read_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * TY_NS_PER_S + (uint64_t)ts.tv_nsec;
}

uint64_t ty_clock_ns(void)
{
    return read_clock(CLOCK_MONOTONIC);
}

uint64_t ty_clock_us(void)
{
    return read_clock(CLOCK_MONOTONIC) / TY_NS_PER_US;
}

uint64_t ty_clock_ms(void)
{
    return read_clock(CLOCK_MONOTONIC) / TY_NS_PER_MS;
}

uint64_t ty_wall_ms(void)
{
    return read_clock(CLOCK_REALTIME) / TY_NS_PER_MS;
}

void ty_sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / TY_NS_PER_S), .tv_nsec = (long)(ns % TY_NS_PER_S)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
