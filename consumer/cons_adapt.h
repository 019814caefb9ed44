/*
 * cons_adapt: the adaptive in-flight cap of one delivery loop.
 *
 * Requests in flight beyond what keeps the loop busy buy no throughput: while the loop itself
 * is the bottleneck (a backlog drained to endpoints that answer at once), each extra request
 * is an answer waiting in its socket until the loop gets to it. They are not free either:
 * libcurl 7.88's CPU per request grows with the transfers and connections it holds (on one
 * host, 23 µs per request at 100 in flight, 50 at 10,000: bench/README.md, "In flight"), and
 * every one of them adds to the wait of all the others. So the loop measures the share of
 * its time it spends waiting in epoll (idle) over windows of CONS_ADAPT_WINDOW_US and moves
 * the cap it dispatches under, between a floor and its share of max_inflight:
 *
 *   saturated   idle < CONS_ADAPT_BUSY_IDLE of the window, answers piling up between turns
 *               (CONS_ADAPT_PILE answered per loop turn on average) and at least the floor in
 *               flight at its end: cap = 3/4 of the requests in flight or of the cap, the
 *               lower (not below the floor): fewer requests keep a saturated loop just as
 *               busy, for less CPU each. From what runs, because the per-endpoint caps may hold
 *               it under the cap. A loop busy with something else keeps its cap: reading and
 *               spilling a Kafka backlog while slow endpoints answer a few per turn, a
 *               rebalance, a slow Redis call;
 *   starved     idle >= CONS_ADAPT_GROW_IDLE and the cap held back an endpoint that was
 *               ready to send: cap += cap / 2 (up to the share of max_inflight);
 *   otherwise   unchanged.
 *
 * A loop waiting on slow endpoints is idle, so its cap grows back within a second: endpoints
 * that need many requests in flight get them as before. (If it is busy with work that grows
 * with its deliveries, a slow Redis say, the lower cap lowers that work too, and the loop,
 * idle again, raises it.) The cap starts at the share of
 * max_inflight (no sample yet, no change), and with a share at or below the floor nothing
 * moves. Per-endpoint caps (max_inflight_per_endpoint, the AIMD window after throttles) apply
 * beneath it as before.
 *
 * Pure state and arithmetic (no clock, no I/O): the engine feeds it times and idle spans.
 * thread: the owning loop's only.
 */
#ifndef SLUICE_CONS_ADAPT_H
#define SLUICE_CONS_ADAPT_H

#include <stdbool.h>
#include <stdint.h>

#define CONS_ADAPT_WINDOW_US 100000 /* one measuring window, µs */
#define CONS_ADAPT_FLOOR     128    /* the lowest cap (or the share of max_inflight, if lower) */
#define CONS_ADAPT_BUSY_IDLE 0.10   /* idle share below which the loop is saturated */
#define CONS_ADAPT_GROW_IDLE 0.25   /* idle share from which a binding cap grows */
#define CONS_ADAPT_PILE      16     /* answers per loop turn that say answers wait for the loop */

struct cons_adapt {
    int64_t max;      /* the loop's share of max_inflight */
    int64_t floor;    /* lowest cap: min(CONS_ADAPT_FLOOR, max) */
    int64_t limit;    /* current cap, floor..max */
    bool enabled;     /* adaptive_inflight; false = the cap stays at max */
    int64_t start_us; /* when the current window began (monotonic µs); 0 = not yet */
    int64_t idle_us;  /* idle time seen in the current window */
    bool bound;       /* the cap held back a ready endpoint in the current window */
    int64_t turns;    /* loop turns in the current window */
    int64_t answered; /* requests answered in the current window */
};

/* Start at max (enabled = adapt; else the cap is max for good). */
void cons_adapt_init(struct cons_adapt *a, int64_t max, bool enabled);

/* The cap to dispatch under now. */
static inline int64_t cons_adapt_limit(const struct cons_adapt *a)
{
    return a->limit;
}

/* The cap held back an endpoint that had a job to send (cons_dispatch stopped on it). */
static inline void cons_adapt_bound(struct cons_adapt *a)
{
    a->bound = true;
}

/*
 * One loop turn at now_us: idle_us of idle time and answered requests answered since the
 * last turn, running = requests in flight now. Closes the window when it has lasted
 * CONS_ADAPT_WINDOW_US: returns the change of the cap that closing it made (0 = none).
 */
int64_t cons_adapt_tick(
    struct cons_adapt *a, int64_t now_us, int64_t idle_us, int64_t answered, int64_t running);

#endif
