#include "env.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decimal.h"
#include "error.h"

/* The value, or NULL when unset or empty (the rule's "as if it did not exist"). */
static const char *value_of(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static FSDP_NORETURN void bad_value(const char *name, const char *value, const char *expected) {
    fsdp_fatal("%s=%s: expected %s", name, value, expected);
}

static int switch_of(const char *name, int fallback) {
    const char *v = value_of(name);
    if (!v) return fallback;
    if (!strcmp(v, "0")) return 0;
    if (!strcmp(v, "1")) return 1;
    bad_value(name, v, fallback ? "1 (on, the default) or 0 (off)" : "0 (off, the default) or 1 (on)");
}

static long long integer_of(const char *name, long long fallback, long long lo, long long hi, const char *expected) {
    const char *v = value_of(name);
    if (!v) return fallback;
    errno = 0;
    long long n = fsdp_plain_decimal(v, 0) ? strtoll(v, NULL, 10) : lo - 1;
    if (errno || n < lo || n > hi) bad_value(name, v, expected);
    return n;
}

/* `text` is `value` or its last part. */
static double positive_real(const char *name, const char *value, const char *text, const char *expected) {
    errno = 0;
    double x = fsdp_plain_decimal(text, 1) ? strtod(text, NULL) : 0.0;
    if (errno || !isfinite(x) || !(x > 0.0)) bad_value(name, value, expected);
    return x;
}

static double g_sync_timeout_s;
static pthread_once_t g_sync_timeout_once = PTHREAD_ONCE_INIT;

static void read_sync_timeout(void) {
    const char *v = value_of("FSDP_SYNC_TIMEOUT");
    g_sync_timeout_s = 600.0;
    if (v) g_sync_timeout_s = positive_real("FSDP_SYNC_TIMEOUT", v, v, "a positive number of seconds (default 600)");
}

double fsdp_env_sync_timeout_s(void) {
    pthread_once(&g_sync_timeout_once, read_sync_timeout);
    return g_sync_timeout_s;
}

int fsdp_env_ckpt_direct_io(void) {
    const char *v = value_of("FSDP_CKPT_IO");
    if (!v || !strcmp(v, "direct")) return 1;
    if (!strcmp(v, "buffered")) return 0;
    bad_value("FSDP_CKPT_IO", v, "direct (the default) or buffered");
}

int fsdp_env_ckpt_threads(void) {
    return (int)integer_of("FSDP_CKPT_THREADS", 4, 1, 64, "a number of threads from 1 to 64 (default 4)");
}

int fsdp_env_tf32(void) { return switch_of("FSDP_TF32", 0); }
int fsdp_env_gemm_tune(void) { return switch_of("FSDP_GEMM_TUNE", 1); }
int fsdp_env_verbose_gemm(void) { return switch_of("FSDP_VERBOSE_GEMM", 0); }
int fsdp_env_verbose_waits(void) { return switch_of("FSDP_VERBOSE_WAITS", 0); }
int fsdp_env_verbose_ckpt(void) { return switch_of("FSDP_VERBOSE_CKPT", 0); }

const char *fsdp_env_nccl_max_ctas(void) { return value_of("FSDP_NCCL_MAX_CTAS"); }
const char *fsdp_env_cudnn_library(void) { return value_of("FSDP_CUDNN_LIBRARY"); }
const char *fsdp_env_test_fail(void) { return value_of("FSDP_TEST_FAIL"); }

long long fsdp_env_test_init_from_window(void) {
    return integer_of("FSDP_TEST_INIT_FROM_WINDOW", 0, 1, 1ll << 40, "a number of elements from 1 to 2^40");
}

int fsdp_env_test_memory_limit(int *rank, double *gib) {
    static const char expected[] = "RANK:GIB (a test hook: a rank number, a positive number of GiB)";
    const char *v = value_of("FSDP_TEST_MEMORY_LIMIT");
    if (!v) return 0;
    const char *colon = strchr(v, ':');
    char rank_text[24];
    if (!colon || colon == v || (size_t)(colon - v) >= sizeof rank_text)
        bad_value("FSDP_TEST_MEMORY_LIMIT", v, expected);
    snprintf(rank_text, sizeof rank_text, "%.*s", (int)(colon - v), v);
    errno = 0;
    long r = fsdp_plain_decimal(rank_text, 0) ? strtol(rank_text, NULL, 10) : -1;
    if (errno || r < 0 || r > 1 << 30) bad_value("FSDP_TEST_MEMORY_LIMIT", v, expected);
    *gib = positive_real("FSDP_TEST_MEMORY_LIMIT", v, colon + 1, expected);
    *rank = (int)r;
    return 1;
}

int fsdp_env_omp_threads_given(void) { return value_of("OMP_NUM_THREADS") != NULL; }
