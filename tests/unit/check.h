/* The unit tests' shared checks. Every check counts in `checks` and, when false, in `failures`, and
 * the test goes on, so that one run shows every failing check; the test's main ends with
 * `return check_summary("test_NAME");`, which is non-zero when any check failed.
 *  - CHECK(cond) reports a false condition with its file, line and text on stderr (silent when true);
 *  - check_that(ok, fmt, ...) prints one line, "ok:   ..." or "FAIL: ...", and returns ok;
 *  - check_close(what, err, tol) is check_that(err <= tol) with err and tol on the line (a NaN err
 *    fails);
 *  - check_count(ok) counts without a line (for the passing rows of a long table; print the failing
 *    ones with check_that instead);
 *  - check_quiet(ok, fmt, ...) is check_count(ok) that prints "FAIL: ..." when false (a check
 *    inside a loop, or one whose message says what went wrong).
 * One copy per test program (each tests/unit/test_*.c is its own executable). */
#ifndef FSDP_TESTS_UNIT_CHECK_H
#define FSDP_TESTS_UNIT_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static int failures, checks;

#define CHECK(cond)                                                                                  \
    do {                                                                                             \
        checks++;                                                                                    \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                          \
            failures++;                                                                              \
        }                                                                                            \
    } while (0)

static inline int check_count(int ok) {
    checks++;
    failures += !ok;
    return ok;
}

static inline void check_vline(int ok, const char *fmt, va_list ap) {
    printf("%s ", ok ? "ok:  " : "FAIL:");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout); /* a test that crashes later still shows every line before */
}

static inline int check_that(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int check_that(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    check_vline(ok, fmt, ap);
    va_end(ap);
    return check_count(ok);
}

static inline int check_quiet(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int check_quiet(int ok, const char *fmt, ...) {
    if (!ok) {
        va_list ap;
        va_start(ap, fmt);
        check_vline(ok, fmt, ap);
        va_end(ap);
    }
    return check_count(ok);
}

static inline int check_close(const char *what, double err, double tol) {
    return check_that(err <= tol, "%s: %.3e (tol %.0e)", what, err, tol);
}

/* The summary line "<program>: N of M checks failed" and the exit status: 1 when any check failed. */
static inline int check_summary(const char *program) {
    printf("%s: %d of %d checks failed\n", program, failures, checks);
    return failures ? 1 : 0;
}

#endif
