/* Host memory a run needs, estimated before anything is allocated, and the refusal (with the figures)
 * of a run that cannot fit in the host's memory, instead of an out-of-memory kill minutes later or a
 * process that grows until the machine swaps.
 *
 * On the CPU backend the model's state and activations live in host memory: the engine's sharded
 * state (master weights, gradients, Adam moments, the compute-dtype copy), its rings of gathered
 * units and gradient buffers (the rules of src/shard/engine.c) and one micro-batch's activations
 * (fsdp_model_activation_bytes). On either backend the checkpoint snapshots take pinned host memory
 * (src/train/ckpt_saver.c). The ranks of a node share it: their needs are added and compared with
 * what the host can still give (MemAvailable, lowered by a cgroup v2 limit). Only what is certain
 * is counted (no library buffers), so a run refused here could never have run. GPU memory is not
 * counted here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/watchdog.h"
#include "checkpointing.h"

#define SHARD_ALIGN 64 /* src/shard/engine.c */

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
    double device, snapshot; /* bytes per rank */
} need;

/* Ring bytes of units grouped by padded size, capacity rule of the engine's build_rings. */
static double rings(const fsdp_trainer *t, const int64_t *padded, int per_unit, size_t esize) {
    int n = t->layout.num_units;
    double total = 0;
    for (int u = 0; u < n; u++) {
        int first = 1, count = 0, pinned = 0;
        for (int v = 0; v < n; v++)
            if (padded[v] == padded[u]) {
                if (v < u) first = 0;
                count++;
                pinned += t->pinned[v];
            }
        if (!first) continue;
        int cap = per_unit ? count : t->opt.max_live + pinned;
        total += (double)(cap < count ? cap : count) * (double)padded[u] * (double)esize;
    }
    return total;
}

static need estimate(const fsdp_trainer *t) {
    const fsdp_train_options *o = &t->opt;
    fsdp_backend *be = t->be;
    int world = t->topo.world;
    int S = o->strategy == FSDP_NO_SHARD ? 1 : o->strategy == FSDP_HYBRID ? t->topo.node_size : world;
    int R = world / (S > 0 ? S : 1);
    size_t me = be->dtype_size(be, o->master_dtype), ce = be->dtype_size(be, o->compute_dtype);
    size_t re = be->dtype_size(be, o->reduce_dtype);
    int n = t->layout.num_units;
    int64_t *padded = fsdp_xcalloc((size_t)n, sizeof *padded, "the memory plan");
    double shard = 0;
    for (int u = 0; u < n; u++) {
        int64_t align = (int64_t)S * SHARD_ALIGN;
        padded[u] = (t->layout.units[u].numel + align - 1) / align * align;
        shard += (double)(padded[u] / S);
    }
    need r = {0, 0};
    r.device = 4 * shard * (double)me;
    if (o->compute_dtype != o->master_dtype) r.device += shard * (double)ce;
    if (S > 1) r.device += rings(t, padded, o->strategy == FSDP_SHARD_GRAD_OP, ce);
    if (!(S == 1 && R == 1 && o->reduce_dtype == o->master_dtype)) r.device += rings(t, padded, 0, re);
    fsdp_model_shape shape = fsdp_plan_model_shape(&t->cfg, o);
    r.device += (double)fsdp_model_activation_bytes(&t->cfg, &shape, be->dtype_size(be, be->act_dtype));
    /* The first replica of every shard writes the checkpoints (src/train/ckpt_saver.c). */
    int writes = o->strategy == FSDP_NO_SHARD ? t->topo.rank == 0
                 : o->strategy == FSDP_HYBRID ? t->topo.node == 0 : 1;
    if (o->ckpt_dir && writes) r.snapshot = 3 * shard * (double)me;
    free(padded);
    return r;
}

static double gb(double bytes) { return bytes / 1e9; }

int fsdp_host_memory_check(fsdp_trainer *t, fsdp_err *err) {
    need mine = estimate(t);
    int on_gpu = strcmp(t->be->name, "cpu") != 0;
    /* The ranks of one node share its host memory. */
    double node[2] = {on_gpu ? mine.snapshot : mine.device + mine.snapshot, mine.snapshot};
    MPI_Comm comm;
    FSDP_CHECK_MPI(MPI_Comm_split_type(t->world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &comm));
    fsdp_mpi_allreduce(node, 2, MPI_DOUBLE, MPI_SUM, comm, "the ranks of this node to plan memory");
    int local_ranks = 1;
    FSDP_CHECK_MPI(MPI_Comm_size(comm, &local_ranks));
    FSDP_CHECK_MPI(MPI_Comm_free(&comm));
    double host = host_available();
    if (host > 0 && node[0] > host)
        fsdp_errf(err,
                  "this run needs at least %.2f GB of host memory on this node (%d rank(s); %.2f GB of it for "
                  "checkpoint snapshots) but the host has %.2f GB available: %s",
                  gb(node[0]), local_ranks, gb(node[1]), gb(host),
                  on_gpu ? "use more nodes, or no --ckpt-dir"
                         : "lower --mbs or --seq, use --strategy FULL, or more nodes");
    return fsdp_agree(&t->world, err);
}
