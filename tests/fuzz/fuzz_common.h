/*
 * fuzz_common.h: shared by the libFuzzer harnesses in tests/fuzz (not a project header).
 *
 * Each fuzz_<name>.c defines LLVMFuzzerTestOneInput and checks invariants with
 * SL_FUZZ_CHECK, which aborts (a crash for libFuzzer) with the failed condition. Built with
 * -fsanitize=fuzzer the libFuzzer runtime supplies main(); built with SL_FUZZ_MAIN
 * (fuzz_main.c) a plain main() replays files and directories, so gcc builds and ctest can run
 * the corpus without clang.
 */
#ifndef SL_FUZZ_COMMON_H
#define SL_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SL_FUZZ_CHECK(cond)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);     \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Every error carries its code and a non-empty, bounded, NUL-terminated message. */
#define SL_FUZZ_CHECK_ERR(rc, err)                                                                 \
    do {                                                                                           \
        SL_FUZZ_CHECK((rc) < 0);                                                                   \
        SL_FUZZ_CHECK((err).code == (rc));                                                         \
        SL_FUZZ_CHECK((err).msg[0] != '\0');                                                       \
        SL_FUZZ_CHECK(memchr((err).msg, '\0', sizeof((err).msg)) != NULL);                         \
    } while (0)

#endif /* SL_FUZZ_COMMON_H */
