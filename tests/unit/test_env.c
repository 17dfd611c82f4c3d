/* The environment's one rule (src/base/env.h): unset or empty is the default; a switch is "0" or
 * "1"; a number is plain decimal within its range; a word is one of its words; anything else stops
 * the program with a message naming the variable and its value. Each variable is checked on its
 * default, its accepted values and a malformed value (in a child process, since that is fatal). Also
 * OMP_NUM_THREADS and the share of the CPUs each rank takes when it is unset (host_threads.h). */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/env.h"
#include "base/host_threads.h"
#include "check.h"

static void set(const char *name, const char *value) {
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

static int probe_tf32(void) { return fsdp_env_tf32(); }
static int probe_gemm_tune(void) { return fsdp_env_gemm_tune(); }
static int probe_verbose_gemm(void) { return fsdp_env_verbose_gemm(); }
static int probe_verbose_waits(void) { return fsdp_env_verbose_waits(); }
static int probe_verbose_ckpt(void) { return fsdp_env_verbose_ckpt(); }
static int probe_ckpt_threads(void) { return fsdp_env_ckpt_threads(); }
static int probe_ckpt_direct_io(void) { return fsdp_env_ckpt_direct_io(); }
static int probe_sync_timeout(void) { return (int)(fsdp_env_sync_timeout_s() * 10.0); }
static int probe_memory_limit(void) {
    int rank = -1;
    double gib = 0.0;
    return fsdp_env_test_memory_limit(&rank, &gib) ? rank * 1000 + (int)(gib * 10.0) : -1;
}

/* Runs `probe` in a child with name=value. Returns 1 when the child returned `want` (fatal == 0)
 * or stopped with status 1 and a message naming "name=value" (fatal == 1). */
static int in_child(const char *name, const char *value, int (*probe)(void), int want, int fatal) {
    int pipe_fd[2];
    if (pipe(pipe_fd)) return 0;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        close(pipe_fd[0]);
        dup2(pipe_fd[1], STDERR_FILENO);
        set(name, value);
        _exit(probe() == want ? 0 : 3);
    }
    close(pipe_fd[1]);
    char text[1024] = "";
    size_t used = 0;
    for (ssize_t n; used + 1 < sizeof text && (n = read(pipe_fd[0], text + used, sizeof text - 1 - used)) > 0;)
        used += (size_t)n;
    text[used] = 0;
    close(pipe_fd[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
    if (!fatal) return WEXITSTATUS(status) == 0;
    char named[256];
    snprintf(named, sizeof named, "%s=%s: expected ", name, value);
    return WEXITSTATUS(status) == 1 && strstr(text, named) != NULL;
}

static void accepts(const char *name, const char *value, int (*probe)(void), int want) {
    check_that(in_child(name, value, probe, want, 0), "%s=%s gives %d", name, value ? value : "(unset)", want);
}

static void refuses(const char *name, const char *value, int (*probe)(void)) {
    check_that(in_child(name, value, probe, 0, 1), "%s='%s' stops with a message naming it", name, value);
}

static void switch_rule(const char *name, int (*probe)(void), int fallback) {
    accepts(name, NULL, probe, fallback);
    accepts(name, "", probe, fallback);
    accepts(name, "0", probe, 0);
    accepts(name, "1", probe, 1);
    refuses(name, "2", probe);
    refuses(name, "yes", probe);
    refuses(name, " 1", probe);
}

int main(void) {
    switch_rule("FSDP_TF32", probe_tf32, 0);
    switch_rule("FSDP_GEMM_TUNE", probe_gemm_tune, 1);
    switch_rule("FSDP_VERBOSE_GEMM", probe_verbose_gemm, 0); /* "0" is off, as for every switch */
    switch_rule("FSDP_VERBOSE_WAITS", probe_verbose_waits, 0);
    switch_rule("FSDP_VERBOSE_CKPT", probe_verbose_ckpt, 0);

    accepts("FSDP_CKPT_THREADS", NULL, probe_ckpt_threads, 4);
    accepts("FSDP_CKPT_THREADS", "", probe_ckpt_threads, 4);
    accepts("FSDP_CKPT_THREADS", "1", probe_ckpt_threads, 1);
    accepts("FSDP_CKPT_THREADS", "64", probe_ckpt_threads, 64);
    refuses("FSDP_CKPT_THREADS", "0", probe_ckpt_threads);
    refuses("FSDP_CKPT_THREADS", "65", probe_ckpt_threads);
    refuses("FSDP_CKPT_THREADS", "0x8", probe_ckpt_threads);
    refuses("FSDP_CKPT_THREADS", "8 ", probe_ckpt_threads);
    refuses("FSDP_CKPT_THREADS", "99999999999999999999", probe_ckpt_threads);

    accepts("FSDP_CKPT_IO", NULL, probe_ckpt_direct_io, 1);
    accepts("FSDP_CKPT_IO", "direct", probe_ckpt_direct_io, 1);
    accepts("FSDP_CKPT_IO", "buffered", probe_ckpt_direct_io, 0);
    refuses("FSDP_CKPT_IO", "Direct", probe_ckpt_direct_io);

    accepts("FSDP_SYNC_TIMEOUT", NULL, probe_sync_timeout, 6000);
    accepts("FSDP_SYNC_TIMEOUT", "2.5", probe_sync_timeout, 25);
    accepts("FSDP_SYNC_TIMEOUT", "1e3", probe_sync_timeout, 10000);
    refuses("FSDP_SYNC_TIMEOUT", "soon", probe_sync_timeout);
    refuses("FSDP_SYNC_TIMEOUT", "0", probe_sync_timeout);
    refuses("FSDP_SYNC_TIMEOUT", "-5", probe_sync_timeout);
    refuses("FSDP_SYNC_TIMEOUT", "inf", probe_sync_timeout);
    refuses("FSDP_SYNC_TIMEOUT", "10s", probe_sync_timeout);

    accepts("FSDP_TEST_MEMORY_LIMIT", NULL, probe_memory_limit, -1);
    accepts("FSDP_TEST_MEMORY_LIMIT", "2:0.5", probe_memory_limit, 2005);
    accepts("FSDP_TEST_MEMORY_LIMIT", "0:3", probe_memory_limit, 30);
    refuses("FSDP_TEST_MEMORY_LIMIT", "2", probe_memory_limit);
    refuses("FSDP_TEST_MEMORY_LIMIT", ":2", probe_memory_limit);
    refuses("FSDP_TEST_MEMORY_LIMIT", "-1:2", probe_memory_limit);
    refuses("FSDP_TEST_MEMORY_LIMIT", "1:0", probe_memory_limit);
    refuses("FSDP_TEST_MEMORY_LIMIT", "1:2GiB", probe_memory_limit);

    set("FSDP_NCCL_MAX_CTAS", "gather=8");
    set("FSDP_TEST_FAIL", "");
    const char *ctas = fsdp_env_nccl_max_ctas();
    check_that(ctas && !strcmp(ctas, "gather=8"), "FSDP_NCCL_MAX_CTAS comes back as its text");
    check_that(fsdp_env_test_fail() == NULL, "an empty FSDP_TEST_FAIL is unset");

    set("OMP_NUM_THREADS", NULL);
    check_that(!fsdp_env_omp_threads_given(), "OMP_NUM_THREADS unset: fsdp.c shares the CPUs out");
    set("OMP_NUM_THREADS", "");
    check_that(!fsdp_env_omp_threads_given(), "an empty OMP_NUM_THREADS is unset");
    set("OMP_NUM_THREADS", "3");
    check_that(fsdp_env_omp_threads_given(), "OMP_NUM_THREADS set: left to OpenMP");

    /* The share of an unbound rank; a bound one keeps its CPU set; never fewer than one thread. */
    check_that(fsdp_host_threads_for(16, 16, 1) == 16, "one rank on 16 CPUs: 16 threads");
    check_that(fsdp_host_threads_for(16, 16, 2) == 8, "two unbound ranks on 16 CPUs: 8 threads each");
    check_that(fsdp_host_threads_for(16, 16, 3) == 5, "three unbound ranks on 16 CPUs: 5 threads each");
    check_that(fsdp_host_threads_for(2, 2, 4) == 1, "four ranks on 2 CPUs: 1 thread each");
    check_that(fsdp_host_threads_for(4, 16, 4) == 4, "a rank bound to 4 of 16 CPUs: 4 threads");
    check_that(fsdp_host_threads_for(1, 16, 8) == 1, "a rank bound to one CPU: 1 thread");
    check_that(fsdp_host_threads_for(0, 16, 2) == 1, "no CPU count: 1 thread");

    /* The initial weights' threads follow the rule above whatever OMP_NUM_THREADS says: with it set
     * to 1, a process alone on its host still draws them with every CPU it may run on. */
    set("OMP_NUM_THREADS", "1");
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    int allowed = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    fsdp_share_host_threads(MPI_COMM_NULL);
    check_that(fsdp_start_up_threads() == (allowed > 0 ? allowed : 1),
               "OMP_NUM_THREADS=1: the start-up work still takes the %d CPUs this process may use (%d)", allowed,
               fsdp_start_up_threads());
    set("OMP_NUM_THREADS", NULL);

    return check_summary("test_env");
}
