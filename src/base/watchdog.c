#include "watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "env.h"
#include "error.h"
#include "log.h"

void fsdp_sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void fsdp_mpi_wait(MPI_Request *request, const char *what) {
    double limit = fsdp_env_sync_timeout_s(), start = fsdp_now();
    for (long spins = 0;; spins++) {
        int done = 0;
        FSDP_CHECK_MPI(MPI_Test(request, &done, MPI_STATUS_IGNORE));
        if (done) return;
        if (spins < 1000) continue; /* most collectives here finish within microseconds */
        fsdp_sleep_us(50);
        if ((spins & 255) == 0 && fsdp_now() - start > limit)
            fsdp_fatal("no progress for %.0f s while waiting for %s: a peer rank has probably failed or stalled "
                       "(see its message, if any); set FSDP_SYNC_TIMEOUT to wait longer",
                       fsdp_now() - start, what);
    }
}

void fsdp_mpi_allreduce(void *buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, const char *what) {
    MPI_Request request;
    FSDP_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, comm, &request));
    fsdp_mpi_wait(&request, what);
}

/* ---- start-up ---------------------------------------------------------------------------------- */

static struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* on CLOCK_MONOTONIC */
    int armed, disarmed;
    double limit_s;
    char who[320], what[200];
    char term_line[768]; /* written by the SIGTERM handler: formatted before, as a handler may not */
    size_t term_len;
    struct sigaction old_term;
} g_startup;
static atomic_flag g_startup_said = ATOMIC_FLAG_INIT; /* one line per process, whoever says it */

int fsdp_startup_rank(void) {
    static const char *const VARS[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    for (int i = 0; VARS[i]; i++) {
        const char *v = getenv(VARS[i]);
        char *end = NULL;
        long r = v && *v ? strtol(v, &end, 10) : -1;
        if (v && *v && end && !*end && r >= 0 && r <= 1 << 30) return (int)r;
    }
    return -1;
}

int fsdp_startup_world(void) {
    /* Open MPI's mpirun, PMI (MPICH's Hydra, Slurm's pmi2) and an srun step. */
    static const char *const VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", NULL};
    int world = 1;
    for (int i = 0; VARS[i]; i++) {
        const char *v = getenv(VARS[i]);
        char *end = NULL;
        long n = v && *v ? strtol(v, &end, 10) : -1;
        if (v && *v && end && !*end && n > world && n <= 1 << 30) world = (int)n;
    }
    return world;
}

static void say(const char *line, size_t len) {
    while (len > 0) {
        ssize_t w = write(STDERR_FILENO, line, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        line += w, len -= (size_t)w;
    }
}

static void on_term(int sig) {
    int saved = errno;
    if (!atomic_flag_test_and_set(&g_startup_said)) say(g_startup.term_line, g_startup.term_len);
    errno = saved;
    raise(sig); /* SA_RESETHAND restored the default: the process ends by the signal once this returns */
}

static void *startup_main(void *arg) {
    (void)arg;
    struct timespec deadline;
    if (clock_gettime(CLOCK_MONOTONIC, &deadline) != 0)
        fsdp_fatal("the start-up watchdog: clock_gettime(CLOCK_MONOTONIC) failed: %s", strerror(errno));
    double whole = (double)(time_t)g_startup.limit_s;
    deadline.tv_sec += (time_t)whole;
    deadline.tv_nsec += (long)((g_startup.limit_s - whole) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&g_startup.lock);
    int rc = 0;
    while (!g_startup.disarmed && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&g_startup.cond, &g_startup.lock, &deadline);
    int expired = !g_startup.disarmed;
    pthread_mutex_unlock(&g_startup.lock);
    if (!expired) return NULL;
    char line[1024];
    int n = snprintf(line, sizeof line,
                     "fsdp: %s: no progress for %g s while waiting for %s: a rank of the job has probably failed or "
                     "stalled before joining (see its message, if any); set FSDP_SYNC_TIMEOUT to wait longer\n",
                     g_startup.who, g_startup.limit_s, g_startup.what);
    if (!atomic_flag_test_and_set(&g_startup_said)) say(line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
    _exit(1); /* not exit(): the main thread is inside MPI, whose exit handlers could wait as well */
}

void fsdp_startup_watchdog_arm(const char *what) {
    if (g_startup.armed) return;
    g_startup.limit_s = fsdp_env_sync_timeout_s();
    if (g_startup.limit_s > 1e9) g_startup.limit_s = 1e9; /* "never", within a time_t */
    char host[256] = "an unknown host";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "an unknown host");
    host[sizeof host - 1] = 0;
    int rank = fsdp_startup_rank();
    if (rank >= 0)
        snprintf(g_startup.who, sizeof g_startup.who, "rank %d on %s", rank, host);
    else
        snprintf(g_startup.who, sizeof g_startup.who, "process %ld on %s", (long)getpid(), host);
    snprintf(g_startup.what, sizeof g_startup.what, "%s", what);
    int n = snprintf(g_startup.term_line, sizeof g_startup.term_line,
                     "fsdp: %s: terminated by SIGTERM while waiting for %s (a launcher ends every rank once one has "
                     "failed, or when the job is cancelled)\n", g_startup.who, g_startup.what);
    g_startup.term_len = n < (int)sizeof g_startup.term_line ? (size_t)n : sizeof g_startup.term_line - 1;

    pthread_condattr_t attr;
    int e = pthread_condattr_init(&attr);
    if (e == 0) e = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (e == 0) e = pthread_cond_init(&g_startup.cond, &attr);
    if (e == 0) e = pthread_mutex_init(&g_startup.lock, NULL);
    if (e != 0) fsdp_fatal("the start-up watchdog: pthread_cond_init or pthread_mutex_init failed: %s", strerror(e));
    pthread_condattr_destroy(&attr);
    g_startup.disarmed = 0;
    if ((e = pthread_create(&g_startup.thread, NULL, startup_main, NULL)) != 0)
        fsdp_fatal("the start-up watchdog: pthread_create failed: %s", strerror(e));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, &g_startup.old_term) != 0)
        fsdp_fatal("the start-up watchdog: sigaction(SIGTERM) failed: %s", strerror(errno));
    g_startup.armed = 1;
}

void fsdp_startup_watchdog_disarm(void) {
    if (!g_startup.armed) return;
    /* Give SIGTERM back, unless MPI installed a handler of its own meanwhile. */
    struct sigaction now;
    if (sigaction(SIGTERM, NULL, &now) == 0 && now.sa_handler == on_term && sigaction(SIGTERM, &g_startup.old_term, NULL) != 0)
        fsdp_fatal("the start-up watchdog: sigaction(SIGTERM) failed: %s", strerror(errno));
    pthread_mutex_lock(&g_startup.lock);
    g_startup.disarmed = 1;
    pthread_cond_signal(&g_startup.cond);
    pthread_mutex_unlock(&g_startup.lock);
    int e = pthread_join(g_startup.thread, NULL);
    if (e != 0) fsdp_fatal("the start-up watchdog: pthread_join failed: %s", strerror(e));
    pthread_cond_destroy(&g_startup.cond);
    pthread_mutex_destroy(&g_startup.lock);
    g_startup.armed = 0;
}
