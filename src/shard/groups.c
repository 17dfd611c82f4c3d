/* Process groups and communicators: the shard and replica groups of each strategy, and one backend
 * communicator per concurrent use (NCCL orders the operations of a communicator, and the gather,
 * reduce and compute streams run concurrently). */
#include <strings.h>

#include "../base/error.h"
#include "engine_internal.h"

static const char *const STRATEGY_NAMES[] = {"FULL", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID"};

int fsdp_strategy_parse(const char *text, fsdp_strategy *out) {
    static const struct {
        const char *name;
        fsdp_strategy s;
    } names[] = {{"FULL", FSDP_FULL},         {"FULL_SHARD", FSDP_FULL}, {"SHARD_GRAD_OP", FSDP_SHARD_GRAD_OP},
                 {"NO_SHARD", FSDP_NO_SHARD}, {"HYBRID", FSDP_HYBRID}, {"HYBRID_SHARD", FSDP_HYBRID}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!strcasecmp(text, names[i].name)) {
            *out = names[i].s;
            return 0;
        }
    }
    return -1;
}

const char *fsdp_strategy_name(fsdp_strategy s) { return STRATEGY_NAMES[s]; }

void fsdp_strategy_groups(fsdp_strategy s, int world, int node_size, int *shard_size, int *replica_size) {
    switch (s) {
    case FSDP_FULL:
    case FSDP_SHARD_GRAD_OP: *shard_size = world, *replica_size = 1; break;
    case FSDP_NO_SHARD: *shard_size = 1, *replica_size = world; break;
    default: *shard_size = node_size, *replica_size = world / node_size; break;
    }
}

static void split_groups(fsdp_engine *e, MPI_Comm world, const fsdp_topology *t) {
    int shard_color, replica_color;
    switch (e->opts.strategy) {
    case FSDP_FULL:
    case FSDP_SHARD_GRAD_OP: shard_color = 0, replica_color = t->rank; break;
    case FSDP_NO_SHARD: shard_color = t->rank, replica_color = 0; break;
    default: shard_color = t->node, replica_color = t->node_rank; break;
    }
    FSDP_CHECK_MPI(MPI_Comm_split(world, shard_color, t->rank, &e->shard_mpi));
    FSDP_CHECK_MPI(MPI_Comm_split(world, replica_color, t->rank, &e->replica_mpi));
    FSDP_CHECK_MPI(MPI_Comm_rank(e->shard_mpi, &e->shard_rank));
    FSDP_CHECK_MPI(MPI_Comm_size(e->shard_mpi, &e->shard_size));
    FSDP_CHECK_MPI(MPI_Comm_rank(e->replica_mpi, &e->replica_rank));
    FSDP_CHECK_MPI(MPI_Comm_size(e->replica_mpi, &e->replica_size));
}

void engine_open_groups(fsdp_engine *e, MPI_Comm world, const fsdp_topology *topo) {
    fsdp_backend *be = e->be;
    const fsdp_shard_options *opts = &e->opts;
    split_groups(e, world, topo);
    int S = e->shard_size;
    int expect_S, expect_R;
    fsdp_strategy_groups(opts->strategy, topo->world, topo->node_size, &expect_S, &expect_R);
    FSDP_ASSERT(expect_S == S && expect_R == e->replica_size);

    /* Before the buffers: those gathers send from and receive into belong to the gather
     * communicator. */
    if (S > 1) {
        e->gather_comm = be->coll->comm_create(be, e->shard_mpi, "gather",
                                               opts->copy_engine_gathers ? FSDP_COMM_COPY_ENGINES : 0);
        if (!opts->forward_only) {
            e->reduce_comm = be->coll->comm_create(be, e->shard_mpi, "reduce-scatter",
                                                   opts->copy_engine_reductions ? FSDP_COMM_COPY_ENGINES : 0);
            e->norm_comm = be->coll->comm_create(be, e->shard_mpi, "gradient norm", 0);
        }
    }
    if (e->replica_size > 1 && !opts->forward_only)
        e->replica_comm = be->coll->comm_create(be, e->replica_mpi, "replica all-reduce", 0);
    engine_open_secondary(e, world, topo);
    FSDP_CHECK_MPI(MPI_Comm_size(world, &e->world_size));
    /* Gradient rows are gathered over the whole world on the reduce stream: reuse the communicator
     * that already spans it there, or make one (HYBRID, whose groups are both smaller). */
    if (e->world_size > 1 && !opts->forward_only) {
        if (S == e->world_size)
            e->rows_comm = e->reduce_comm;
        else if (e->replica_size == e->world_size)
            e->rows_comm = e->replica_comm;
        else
            e->rows_comm = e->own_rows_comm = be->coll->comm_create(be, world, "gradient rows", 0);
    }
}

void engine_close_groups(fsdp_engine *e) {
    fsdp_backend *be = e->be;
    be->coll->comm_destroy(be, e->gather_comm);
    be->coll->comm_destroy(be, e->reduce_comm);
    be->coll->comm_destroy(be, e->norm_comm);
    be->coll->comm_destroy(be, e->replica_comm);
    be->coll->comm_destroy(be, e->own_rows_comm);
    engine_close_secondary(e);
    FSDP_CHECK_MPI(MPI_Comm_free(&e->shard_mpi));
    FSDP_CHECK_MPI(MPI_Comm_free(&e->replica_mpi));
}

int fsdp_engine_shard_rank(const fsdp_engine *e) { return e->shard_rank; }
int fsdp_engine_shard_size(const fsdp_engine *e) { return e->shard_size; }
int fsdp_engine_replica_rank(const fsdp_engine *e) { return e->replica_rank; }
int fsdp_engine_replica_size(const fsdp_engine *e) { return e->replica_size; }
