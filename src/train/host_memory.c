/* Host memory a run needs, known before anything is allocated, and the refusal (with the figures)
 * of a run that cannot fit in the host's memory, instead of an out-of-memory kill minutes later or a
 * process that grows until the machine swaps.
 *
 * On the CPU backend everything the backend allocates lives in host memory: the run's memory plan
 * (src/train/memory_plan.c: the engine's state and rings, the activations, the workspace), which
 * equals the backend's max_reserved_bytes to the byte. On either backend the checkpoint snapshots
 * take pinned host memory (src/train/ckpt_saver.c), which the plan does not count. The ranks of a
 * node share the host: their needs are added and compared with what the host can still give
 * (MemAvailable, lowered by a cgroup v2 limit). A fresh run also stages its initial weights through
 * host memory, one unit's shard at a time (fsdp_trainer_init_weights: fp32, and a copy in the master
 * dtype when that is narrower). Only what is certain is counted (no library
 * buffers, no transient op scratch), so a run refused here could never have run. GPU memory is the
 * plan's business (--mbs auto, --memory-limit), not counted here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/agree.h"
#include "../base/watchdog.h"
#include "checkpointing.h"

/* Bytes the host can still give: MemAvailable, lowered by a cgroup limit (SLURM, containers). */
static double host_available(void) {
    double avail = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (double)kb * 1024.0;
    }
    if (f) fclose(f);
    /* cgroup v2: the limit of this process's group, minus what the group already uses. */
    char group[1024] = "", path[1400];
    f = fopen("/proc/self/cgroup", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "0::", 3)) snprintf(group, sizeof group, "%.*s", (int)strcspn(line + 3, "\n"), line + 3);
    if (f) fclose(f);
    if (group[0]) {
        unsigned long long max = 0, cur = 0;
        snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", strcmp(group, "/") ? group : "");
        FILE *m = fopen(path, "r");
        int have_max = m && fscanf(m, "%llu", &max) == 1;
        if (m) fclose(m);
        snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.current", strcmp(group, "/") ? group : "");
        m = fopen(path, "r");
        int have_cur = m && fscanf(m, "%llu", &cur) == 1;
        if (m) fclose(m);
        if (have_max && have_cur && max > cur && (avail < 0 || (double)(max - cur) < avail)) avail = (double)(max - cur);
    }
    return avail;
}

typedef struct {
    double device, snapshot, staging; /* bytes per rank */
} need;

/* The run's memory plan (t->plan, made by fsdp_fit_choose with the micro-batch the run will use) is
 * exactly what the backend allocates per rank: all of it host memory on the CPU backend. The plan
 * does not count the checkpoint snapshot (host memory on either backend), which the first replica
 * of every shard holds (the engine's replica groups: every rank for FULL and SHARD_GRAD_OP, rank 0
 * for NO_SHARD, the first node for HYBRID). */
static need estimate(const fsdp_trainer *t) {
    const fsdp_train_options *o = &t->opt;
    need r = {(double)t->plan.reserved, 0, 0};
    int writes = o->strategy == FSDP_NO_SHARD ? t->topo.rank == 0
                 : o->strategy == FSDP_HYBRID ? t->topo.node == 0 : 1;
    const size_t es = fsdp_device_dtype_size(t->be->kind, o->master_dtype);
    if (o->ckpt_dir && writes) r.snapshot = (double)fsdp_snapshot_bytes(t->plan.engine.total_shard, es);
    /* Without --init-from the run may draw its weights (unless it resumes, which stages its own). */
    if (!o->init_from) r.staging = (double)fsdp_trainer_init_staging_bytes(t->plan.engine.largest_shard, es);
    return r;
}

static double gb(double bytes) { return bytes / 1e9; }

int fsdp_host_memory_check(fsdp_trainer *t, fsdp_err *err) {
    need mine = estimate(t);
    int on_gpu = t->be->kind == FSDP_DEVICE_CUDA;
    /* The ranks of one node share its host memory. */
    double node[3] = {(on_gpu ? 0.0 : mine.device) + mine.snapshot + mine.staging, mine.snapshot, mine.staging};
    MPI_Comm comm;
    FSDP_CHECK_MPI(MPI_Comm_split_type(t->world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &comm));
    fsdp_mpi_allreduce(node, 3, MPI_DOUBLE, MPI_SUM, comm, "the ranks of this node to plan memory");
    int local_ranks = 1;
    FSDP_CHECK_MPI(MPI_Comm_size(comm, &local_ranks));
    FSDP_CHECK_MPI(MPI_Comm_free(&comm));
    double host = host_available();
    if (host > 0 && node[0] > host) {
        char plan[640] = "";
        if (!on_gpu) {
            char line[480];
            fsdp_memory_plan_line(&t->plan, line, sizeof line);
            snprintf(plan, sizeof plan, "; per rank, the plan for --mbs %d: %s", t->opt.mbs, line);
        }
        fsdp_errf(err,
                  "this run needs at least %.2f GB of host memory on this node (%d rank(s); %.2f GB of it for "
                  "checkpoint snapshots, %.2f GB for staging the initial weights) but the host has %.2f GB "
                  "available%s: %s",
                  gb(node[0]), local_ranks, gb(node[1]), gb(node[2]), gb(host), plan,
                  on_gpu ? "use more nodes, or no --ckpt-dir"
                         : "lower --mbs or --seq, use --strategy FULL, or more nodes");
    }
    return fsdp_agree(t->world, err);
}
