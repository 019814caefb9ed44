/*
 * sl_fault: test-only fault points, compiled in by -DSL_FAULT_INJECTION=ON (sluice-api,
 * sluice-consumer, the endpoint table; never a production build). SL_FAULT names the one
 * fault a test process acts out; SL_FAULT_DELAY_MS says how long a fault that waits waits.
 * Each fault point documents itself where it is; without the build option sl_fault_is() is
 * a constant false and the point compiles away.
 */
#ifndef SL_FAULT_H
#define SL_FAULT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Is this process acting out fault `name` (SL_FAULT=name)? */
static inline bool sl_fault_is(const char *name)
{
#ifdef SL_FAULT_INJECTION
    const char *f = getenv("SL_FAULT");
    return f && strcmp(f, name) == 0;
#else
    (void)name;
    return false;
#endif
}

/* How long a waiting fault waits: SL_FAULT_DELAY_MS, def_ms when unset. */
static inline int64_t sl_fault_delay_ms(int64_t def_ms)
{
    const char *d = getenv("SL_FAULT_DELAY_MS");
    return d ? strtoll(d, NULL, 10) : def_ms;
}

#endif /* SL_FAULT_H */
