/* The unit tests' shared check: CHECK(cond) reports a false condition with its file, line and text
 * on stderr and counts it in `failures`, and the test goes on, so that one run shows every failing
 * check; the test's main returns non-zero when failures > 0. One copy per test program (each
 * tests/unit/test_*.c is its own executable). */
#ifndef FSDP_TESTS_UNIT_CHECK_H
#define FSDP_TESTS_UNIT_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond)                                                                                  \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                          \
            failures++;                                                                              \
        }                                                                                            \
    } while (0)

#endif
