// The launch environment: each launcher's variables, first match wins. Open MPI comes first
// because mpirun inside a Slurm allocation starts its daemons with srun, so its ranks also
// inherit SLURM_* (and PMIX_RANK from Open MPI's own PMIx server): OMPI_COMM_WORLD_* is
// the launch that made this process.
#include "parallel/launch_env.h"

#include <unistd.h>

#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace llmtrain {

namespace {

// A whole number >= 0 from variable `name`, or `fallback` when it is unset.
int number(const EnvLookup& env, const char* name, int fallback) {
    const char* value = env(name);
    if (!value) return fallback;
    const std::string_view text(value);
    if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string_view::npos)
        fail(ErrorKind::config, "environment variable ", name, "='", text, "': expected a whole number (set by the MPI or Slurm launcher)");
    return std::atoi(value);
}

// The first of two variables that is set, or `fallback`.
int number(const EnvLookup& env, const char* name, const char* other, int fallback) {
    return number(env, name, number(env, other, fallback));
}

// Tasks on this node of a Slurm step, or `fallback` outside a step.
int slurm_local_size(const EnvLookup& env, int fallback) {
    const char* tasks_per_node = env("SLURM_STEP_TASKS_PER_NODE");
    if (!tasks_per_node) return fallback;
    return slurm_tasks_on_node(tasks_per_node, number(env, "SLURM_NODEID", 0));
}

LaunchEnvironment open_mpi(const EnvLookup& env) {
    LaunchEnvironment launch;
    launch.launcher = Launcher::open_mpi;
    launch.rank = number(env, "OMPI_COMM_WORLD_RANK", 0);
    launch.world_size = number(env, "OMPI_COMM_WORLD_SIZE", 0);
    launch.local_rank = number(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    launch.local_size = number(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 0);
    return launch;
}

// srun --mpi=pmix gives PMIX_RANK and Slurm's own variables; PMIx has no size variable.
LaunchEnvironment pmix(const EnvLookup& env) {
    LaunchEnvironment launch;
    launch.launcher = Launcher::pmix;
    launch.rank = number(env, "PMIX_RANK", 0);
    launch.world_size = number(env, "SLURM_STEP_NUM_TASKS", 0);
    launch.local_rank = number(env, "SLURM_LOCALID", 0);
    launch.local_size = slurm_local_size(env, 0);
    return launch;
}

// PMI-1/2: srun --mpi=pmi2 (node-local rank from Slurm) or hydra (MPI_LOCALRANKID).
LaunchEnvironment pmi(const EnvLookup& env) {
    LaunchEnvironment launch;
    launch.launcher = Launcher::pmi;
    launch.rank = number(env, "PMI_RANK", 0);
    launch.world_size = number(env, "PMI_SIZE", "SLURM_STEP_NUM_TASKS", 0);
    launch.local_rank = number(env, "MPI_LOCALRANKID", "SLURM_LOCALID", 0);
    launch.local_size = number(env, "MPI_LOCALNRANKS", slurm_local_size(env, 0));
    return launch;
}

}  // namespace

int slurm_tasks_on_node(const std::string& tasks_per_node, int node_index) {
    // Comma-separated groups "N" or "N(xR)": R nodes of N tasks each.
    auto malformed = [&] {
        fail(ErrorKind::config, "SLURM_STEP_TASKS_PER_NODE='", tasks_per_node, "': expected counts such as \"4(x2),3\" covering node ", node_index);
    };
    size_t at = 0;
    int first_node = 0;
    while (at < tasks_per_node.size()) {
        size_t end = tasks_per_node.find(',', at);
        if (end == std::string::npos) end = tasks_per_node.size();
        const std::string group = tasks_per_node.substr(at, end - at);
        const size_t paren = group.find("(x");
        const std::string count = group.substr(0, paren);
        const std::string repeat = paren == std::string::npos ? "1" : group.substr(paren + 2, group.size() - paren - 3);
        const bool closed = paren == std::string::npos || group.back() == ')';
        for (const std::string& digits : {count, repeat})
            if (!closed || digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) malformed();
        first_node += std::atoi(repeat.c_str());
        if (node_index < first_node) return std::atoi(count.c_str());
        at = end + 1;
    }
    malformed();
    return 0;
}

LaunchEnvironment read_launch_environment(const EnvLookup& env) {
    if (env("OMPI_COMM_WORLD_SIZE")) return open_mpi(env);
    if (env("PMIX_RANK")) return pmix(env);
    if (env("PMI_RANK") || env("PMI_SIZE") || env("MPI_LOCALNRANKS")) return pmi(env);
    // Inside a job step (the batch script itself has no SLURM_STEP_ID) srun started this
    // process without PMI: one task is a plain single process, several cannot find each other.
    const int step_tasks = env("SLURM_STEP_ID") ? number(env, "SLURM_STEP_NUM_TASKS", 1) : 1;
    if (step_tasks > 1)
        fail(ErrorKind::config, "srun started ", step_tasks, " tasks (SLURM_STEP_NUM_TASKS) without a PMI plugin, so each would train alone as rank 0 of 1: "
             "run `srun --mpi=pmix` (or set MpiDefault=pmix in slurm.conf), or mpirun inside the allocation");
    return {};
}

LaunchEnvironment launch_environment() {
    return read_launch_environment([](const char* name) { return std::getenv(name); });
}

void check_mpi_world_matches(const LaunchEnvironment& launch, int mpi_world_size) {
    if (launch.world_size == 0 || launch.world_size == mpi_world_size) return;
    fail(ErrorKind::config, "the launcher started ", launch.world_size, " ranks but MPI sees a world of ", mpi_world_size,
         ": this MPI library does not speak the launcher's PMI (with srun: try --mpi=pmix or --mpi=pmi2, see `srun --mpi=list`; or use mpirun)");
}

std::string this_node_name() {
    if (const char* name = std::getenv("LLMTRAIN_NODE_NAME"); name && *name) return name;
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) return "unknown";
    return host;
}

}  // namespace llmtrain
