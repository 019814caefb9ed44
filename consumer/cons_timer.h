/*
 * cons_timer: the delivery loop's deadlines, so it sleeps until the nearest one.
 *
 * A loop has a small, fixed set of periodic or one-shot jobs (claim due retries, store
 * offsets, write delivered markers, retry held Redis writes, end an endpoint's pause...). Each
 * has one slot here holding its next deadline (monotonic ms) or none. The owner of a slot
 * arms it when its work becomes due at some time, and re-arms or disarms it whenever it runs:
 * a slot left expired would keep the loop from sleeping. cons_timers_wait_ms turns the
 * nearest deadline into the loop's poll timeout (libuv's timer heap and redis's
 * aeSearchNearestTimer do the same; with a dozen slots a scan is cheaper than a heap).
 * Deadlines that depend on many objects (held jobs, paused endpoints) keep the earliest one
 * in their slot (cons_timer_arm_min) and recompute it when they run.
 *
 * thread: owned by one loop; no locking.
 */
#ifndef CONS_TIMER_H
#define CONS_TIMER_H

#include <stdbool.h>
#include <stdint.h>

#define CONS_TIMERS_MAX 16        /* slots a set can hold */
#define CONS_TIMER_NONE INT64_MAX /* a disarmed slot's deadline */

struct cons_timers {
    int64_t due[CONS_TIMERS_MAX]; /* per slot: deadline (mono ms), or CONS_TIMER_NONE */
    int n;                        /* slots in use, 0..CONS_TIMERS_MAX */
};

/* n slots (at most CONS_TIMERS_MAX), all disarmed. */
void cons_timers_init(struct cons_timers *t, int n);
/* Set slot id's deadline to due_ms (mono ms), replacing any earlier or later one. */
void cons_timer_arm(struct cons_timers *t, int id, int64_t due_ms);
/* Set slot id's deadline to due_ms unless it is armed for earlier. */
void cons_timer_arm_min(struct cons_timers *t, int id, int64_t due_ms);
void cons_timer_disarm(struct cons_timers *t, int id);
bool cons_timer_armed(const struct cons_timers *t, int id);
/* Whether slot id is armed and its deadline is at or before now_ms. */
bool cons_timer_expired(const struct cons_timers *t, int id, int64_t now_ms);
/* The nearest deadline of any slot, or CONS_TIMER_NONE. */
int64_t cons_timers_next(const struct cons_timers *t);
/* Milliseconds from now_ms until the nearest deadline, within 0..max_ms (max_ms when no
 * slot is armed). */
int cons_timers_wait_ms(const struct cons_timers *t, int64_t now_ms, int max_ms);

#endif /* CONS_TIMER_H */
