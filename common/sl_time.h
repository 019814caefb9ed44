/*
 * sl_time: this process's clocks. The wall clock (unix ms) stamps what other processes read
 * (records, outcomes, Redis scores: see sl_rclock.h for the clock shared state is kept on);
 * the monotonic clock measures waits and deadlines, which a wall-clock step must not move.
 *
 * thread: any thread.
 */
#ifndef SL_TIME_H
#define SL_TIME_H

#include <stdint.h>

/* Wall clock in unix ms, and a monotonic clock in ms / µs. */
int64_t sl_now_ms(void);
int64_t sl_mono_ms(void);
int64_t sl_mono_us(void);
/* Sleep ms (>= 0); a signal may end it early (callers that wait for a flag loop on it). */
void sl_sleep_ms(int64_t ms);

#endif /* SL_TIME_H */
