/* Which node a rank is on: physical (shared memory) for the GPU choice, logical for HYBRID. */
#include "engine.h"

int fsdp_topology_detect(MPI_Comm world, int ranks_per_node, fsdp_topology *t, fsdp_err *err) {
    FSDP_CHECK_MPI(MPI_Comm_rank(world, &t->rank));
    FSDP_CHECK_MPI(MPI_Comm_size(world, &t->world));
    MPI_Comm local;
    FSDP_CHECK_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, t->rank, MPI_INFO_NULL, &local));
    FSDP_CHECK_MPI(MPI_Comm_rank(local, &t->local_rank));
    FSDP_CHECK_MPI(MPI_Comm_size(local, &t->local_size));

    if (ranks_per_node > 0) {
        FSDP_CHECK_MPI(MPI_Comm_free(&local));
        if (t->world % ranks_per_node)
            return fsdp_usagef(err, "--ranks-per-node %d does not divide the %d ranks", ranks_per_node, t->world);
        t->node_size = ranks_per_node;
        t->node = t->rank / ranks_per_node;
        t->node_rank = t->rank % ranks_per_node;
        t->num_nodes = t->world / ranks_per_node;
        t->uniform_nodes = 1;
        return 0;
    }
    /* Number the physical nodes by their lowest rank: the leaders (local rank 0) in rank order. */
    MPI_Comm leaders;
    FSDP_CHECK_MPI(MPI_Comm_split(world, t->local_rank == 0 ? 0 : MPI_UNDEFINED, t->rank, &leaders));
    int node = 0, num_nodes = 0;
    if (leaders != MPI_COMM_NULL) {
        FSDP_CHECK_MPI(MPI_Comm_rank(leaders, &node));
        FSDP_CHECK_MPI(MPI_Comm_size(leaders, &num_nodes));
        FSDP_CHECK_MPI(MPI_Comm_free(&leaders));
    }
    FSDP_CHECK_MPI(MPI_Bcast(&node, 1, MPI_INT, 0, local));
    FSDP_CHECK_MPI(MPI_Bcast(&num_nodes, 1, MPI_INT, 0, local));
    FSDP_CHECK_MPI(MPI_Comm_free(&local));
    int lo = t->local_size, hi = t->local_size;
    FSDP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, world));
    FSDP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, world));
    t->node = node;
    t->num_nodes = num_nodes;
    t->node_rank = t->local_rank;
    t->node_size = t->local_size;
    t->uniform_nodes = lo == hi;
    return 0;
}
