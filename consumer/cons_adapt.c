/* cons_adapt: the adaptive in-flight cap of one delivery loop (see cons_adapt.h). */
#include "consumer/cons_adapt.h"

void cons_adapt_init(struct cons_adapt *a, int64_t max, bool enabled)
{
    if (max < 1)
        max = 1;
    *a = (struct cons_adapt){.max = max,
                             .floor = max < CONS_ADAPT_FLOOR ? max : CONS_ADAPT_FLOOR,
                             .limit = max,
                             .enabled = enabled};
}

/* Start a new window at now_us. */
static void window_open(struct cons_adapt *a, int64_t now_us)
{
    a->start_us = now_us;
    a->idle_us = 0;
    a->bound = false;
    a->turns = 0;
    a->answered = 0;
}

int64_t cons_adapt_tick(
    struct cons_adapt *a, int64_t now_us, int64_t idle_us, int64_t answered, int64_t running)
{
    if (!a->enabled || a->floor >= a->max)
        return 0;
    if (a->start_us == 0) {
        window_open(a, now_us);
        return 0;
    }
    a->idle_us += idle_us > 0 ? idle_us : 0;
    a->answered += answered > 0 ? answered : 0;
    a->turns++;
    int64_t span = now_us - a->start_us;
    if (span < CONS_ADAPT_WINDOW_US)
        return 0;
    double idle = (double)a->idle_us / (double)span;
    bool piling = a->answered >= CONS_ADAPT_PILE * a->turns; /* answers wait between turns */
    int64_t old = a->limit, lim = old;
    if (idle < CONS_ADAPT_BUSY_IDLE && piling && running >= a->floor) {
        int64_t from = running < old ? running : old; /* what runs, when other caps hold */
        lim = from - from / 4;
    } else if (idle >= CONS_ADAPT_GROW_IDLE && a->bound) {
        lim = old + old / 2 + 1;
    }
    if (lim < a->floor)
        lim = a->floor;
    if (lim > a->max)
        lim = a->max;
    a->limit = lim;
    window_open(a, now_us);
    return lim - old;
}
