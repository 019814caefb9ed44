/*
 * sl_assert: invariant checks at module boundaries (the job state machine, the offset
 * tracker).
 *
 *   SL_ASSERT(cond, "fmt", ...)   checked when NDEBUG is not defined: debug builds and the
 *                                 sanitizer builds the suite runs (scripts/test.sh), so every
 *                                 test exercises them; compiled out of release builds (the
 *                                 condition is not evaluated: keep side effects out of it).
 *   SL_ASSERT_ALWAYS(cond, ...)   checked in every build, for the few invariants whose
 *                                 breach would lose or duplicate work if the process went on.
 *
 * A failed check prints "sluice: assertion failed at FILE:LINE in FUNC: COND: message" on
 * stderr and aborts (a core dump or the sanitizer's report follows). The message names what
 * was wrong with ids and counts only: never payloads, secrets or URLs.
 */
#ifndef SL_ASSERT_H
#define SL_ASSERT_H

#include <stdio.h>
#include <stdlib.h>

#define SL_ASSERT_FAIL_(cond, ...)                                                                 \
    do {                                                                                           \
        (void)fprintf(stderr, "sluice: assertion failed at %s:%d in %s: %s: ", __FILE__, __LINE__, \
                      __func__, #cond);                                                            \
        (void)fprintf(stderr, __VA_ARGS__);                                                        \
        (void)fputc('\n', stderr);                                                                 \
        abort();                                                                                   \
    } while (0)

#define SL_ASSERT_ALWAYS(cond, ...)                                                                \
    do {                                                                                           \
        if (__builtin_expect(!(cond), 0))                                                          \
            SL_ASSERT_FAIL_(cond, __VA_ARGS__);                                                    \
    } while (0)

#ifdef NDEBUG
#define SL_ASSERT(cond, ...)                                                                       \
    do {                                                                                           \
        (void)sizeof(cond);                                                                        \
    } while (0)
#else
#define SL_ASSERT(cond, ...) SL_ASSERT_ALWAYS(cond, __VA_ARGS__)
#endif

#endif /* SL_ASSERT_H */
