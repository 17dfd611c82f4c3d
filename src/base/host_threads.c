#define _GNU_SOURCE
#include "host_threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include "env.h"
#include "error.h"

static int g_start_up_threads = 1;

int fsdp_host_threads_for(int allowed, int online, int ranks_here) {
    if (allowed < 1) allowed = 1;
    if (ranks_here <= 1 || allowed < online) return allowed;
    int share = allowed / ranks_here;
    return share > 0 ? share : 1;
}

int fsdp_share_host_threads(MPI_Comm world) {
    int ranks_here = 1;
    if (world != MPI_COMM_NULL) {
        MPI_Comm here;
        FSDP_CHECK_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &here));
        FSDP_CHECK_MPI(MPI_Comm_size(here, &ranks_here));
        FSDP_CHECK_MPI(MPI_Comm_free(&here));
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    /* Without an affinity mask to read, treat the rank as unbound. */
    int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)online;
    int threads = fsdp_host_threads_for(allowed, online > 0 ? (int)online : allowed, ranks_here);
    g_start_up_threads = threads;
    if (fsdp_env_omp_threads_given()) return omp_get_max_threads();
    omp_set_num_threads(threads);
    return threads;
}

int fsdp_start_up_threads(void) { return g_start_up_threads; }
