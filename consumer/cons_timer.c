/*
 * cons_timer: the delivery loop's deadline slots (see cons_timer.h). A linear scan over at
 * most CONS_TIMERS_MAX slots finds the nearest one.
 */
#include "consumer/cons_timer.h"

#include "common/sl_assert.h"

void cons_timers_init(struct cons_timers *t, int n)
{
    SL_ASSERT(n >= 0 && n <= CONS_TIMERS_MAX, "%d timer slots", n);
    t->n = n;
    for (int i = 0; i < CONS_TIMERS_MAX; i++)
        t->due[i] = CONS_TIMER_NONE;
}

void cons_timer_arm(struct cons_timers *t, int id, int64_t due_ms)
{
    SL_ASSERT(id >= 0 && id < t->n, "timer slot %d of %d", id, t->n);
    t->due[id] = due_ms;
}

void cons_timer_arm_min(struct cons_timers *t, int id, int64_t due_ms)
{
    SL_ASSERT(id >= 0 && id < t->n, "timer slot %d of %d", id, t->n);
    if (due_ms < t->due[id])
        t->due[id] = due_ms;
}

void cons_timer_disarm(struct cons_timers *t, int id)
{
    SL_ASSERT(id >= 0 && id < t->n, "timer slot %d of %d", id, t->n);
    t->due[id] = CONS_TIMER_NONE;
}

bool cons_timer_armed(const struct cons_timers *t, int id)
{
    return t->due[id] != CONS_TIMER_NONE;
}

bool cons_timer_expired(const struct cons_timers *t, int id, int64_t now_ms)
{
    return t->due[id] != CONS_TIMER_NONE && t->due[id] <= now_ms;
}

int64_t cons_timers_next(const struct cons_timers *t)
{
    int64_t next = CONS_TIMER_NONE;
    for (int i = 0; i < t->n; i++) {
        if (t->due[i] < next)
            next = t->due[i];
    }
    return next;
}

int cons_timers_wait_ms(const struct cons_timers *t, int64_t now_ms, int max_ms)
{
    int64_t next = cons_timers_next(t);
    if (next == CONS_TIMER_NONE)
        return max_ms;
    if (next <= now_ms)
        return 0;
    return next - now_ms < max_ms ? (int)(next - now_ms) : max_ms;
}
