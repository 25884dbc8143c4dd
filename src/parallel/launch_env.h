// Who started this process and what rank, world and node-local rank it gave it, read from
// the environment before MPI is initialized. mpirun (Open MPI), srun --mpi=pmix, srun
// --mpi=pmi2 and MPICH's hydra each say it in their own variables; this is the one place
// that knows them. MPI itself stays the authority once initialized (MPI_Comm_rank,
// MPI_Comm_split_type for the node): the environment decides whether to initialize it, how
// many ranks to expect, and how a node's cores are shared before there is a communicator.
#pragma once

#include <functional>
#include <string>

namespace llmtrain {

enum class Launcher {
    none,      // started by hand (or a one-task srun without PMI): one process, no MPI
    open_mpi,  // mpirun / mpiexec of Open MPI (OMPI_COMM_WORLD_*)
    pmix,      // srun --mpi=pmix, prterun (PMIX_RANK; the world from Slurm when srun)
    pmi,       // srun --mpi=pmi2, MPICH hydra (PMI_RANK, PMI_SIZE; MPI_LOCALRANKID)
};

struct LaunchEnvironment {
    Launcher launcher = Launcher::none;
    int rank = 0;
    int world_size = 1;  // 0: the launcher does not say (PMIx outside Slurm)
    int local_rank = 0;
    int local_size = 1;  // ranks on this node; 0: the launcher does not say
    bool needs_mpi() const { return launcher != Launcher::none; }
};

// A variable's value or nullptr, as getenv answers; tests pass a table.
using EnvLookup = std::function<const char*(const char*)>;

// The launch environment `env` describes. Throws a config error when srun started several
// tasks without a PMI plugin (--mpi=none): each would train alone, as rank 0 of 1.
LaunchEnvironment read_launch_environment(const EnvLookup& env);

// read_launch_environment of this process's environment.
LaunchEnvironment launch_environment();

// The number of tasks on node `node_index` of a Slurm step, from SLURM_STEP_TASKS_PER_NODE's
// compressed list: "4(x2),3" is 4 tasks on nodes 0 and 1, then 3 on node 2. Throws a
// config error naming the text when it is malformed or has no such node.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_index);

// This process's node as messages and node-local files name it: LLMTRAIN_NODE_NAME when set
// (a test gives groups of ranks a node each), else the host name.
std::string this_node_name();

// After MPI_Init: throws a config error when MPI's world is not the one the launcher
// started (an MPI library without the launcher's PMI makes every task a world of one).
void check_mpi_world_matches(const LaunchEnvironment& launch, int mpi_world_size);

}  // namespace llmtrain
