/* Clock helpers. Monotonic time is for durations and deadlines; wall time only for display and
 * for timestamps that cross machines. All functions are thread-safe and never fail. */
#ifndef TYCHO_CLOCK_H
#define TYCHO_CLOCK_H

#include <stdint.h>

/* Monotonic clock in nanoseconds / microseconds / milliseconds since an arbitrary origin. */
uint64_t ty_clock_ns(void);
uint64_t ty_clock_us(void);
uint64_t ty_clock_ms(void);

/* Wall clock (CLOCK_REALTIME) in milliseconds since the Unix epoch. */
uint64_t ty_wall_ms(void);

/* Sleep for `ns` nanoseconds, resuming after signals. */
void ty_sleep_ns(uint64_t ns);

#define TY_NS_PER_US 1000ull
#define TY_NS_PER_MS 1000000ull
#define TY_NS_PER_S 1000000000ull

#endif
