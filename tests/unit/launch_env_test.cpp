// The launch environment of mpirun, srun --mpi=pmix / pmi2 / none, hydra and a batch script,
// each as the launcher sets it (the variable sets were taken from real runs of each).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/error.h"
#include "parallel/launch_env.h"

using namespace llmtrain;

namespace {

using Variables = std::map<std::string, std::string>;

LaunchEnvironment read(const Variables& variables) {
    return read_launch_environment([&](const char* name) -> const char* {
        const auto it = variables.find(name);
        return it == variables.end() ? nullptr : it->second.c_str();
    });
}

// What every process of a Slurm job inherits from its batch script (2 nodes, 8 tasks).
Variables slurm_job() {
    return {{"SLURM_JOB_ID", "42"}, {"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"},
            {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "4(x2)"}};
}

// Task 6 of an 8-task step over two nodes: the third task of the second node.
Variables srun_task_6(Variables extra) {
    Variables v = slurm_job();
    v.insert({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}});
    v["SLURM_PROCID"] = "6", v["SLURM_LOCALID"] = "2", v["SLURM_NODEID"] = "1";
    for (auto& [name, value] : extra) v[name] = value;
    return v;
}

void expect_launch(const LaunchEnvironment& got, Launcher launcher, int rank, int world, int local_rank, int local_size) {
    EXPECT_EQ(got.launcher, launcher);
    EXPECT_EQ(got.rank, rank);
    EXPECT_EQ(got.world_size, world);
    EXPECT_EQ(got.local_rank, local_rank);
    EXPECT_EQ(got.local_size, local_size);
}

}  // namespace

TEST(LaunchEnvironment, NoLauncherIsOneProcessWithoutMpi) {
    const LaunchEnvironment launch = read({});
    expect_launch(launch, Launcher::none, 0, 1, 0, 1);
    EXPECT_FALSE(launch.needs_mpi());
}

TEST(LaunchEnvironment, BatchScriptOfAManyTaskJobIsNotALaunch) {
    // The batch shell sees SLURM_NTASKS=8 and SLURM_PROCID=0 but is no step: no MPI, no refusal.
    EXPECT_FALSE(read(slurm_job()).needs_mpi());
}

TEST(LaunchEnvironment, OpenMpiMpirun) {
    const LaunchEnvironment launch = read({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "16"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"PMIX_RANK", "5"}});
    expect_launch(launch, Launcher::open_mpi, 5, 16, 1, 4);
    EXPECT_TRUE(launch.needs_mpi());
}

TEST(LaunchEnvironment, MpirunInsideASlurmAllocationIsOpenMpisLaunch) {
    // Open MPI starts its daemons with srun (a one-task-per-node step): its ranks inherit
    // the daemons' step variables, which do not describe the MPI world.
    Variables v = srun_task_6({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
    v["SLURM_STEP_NUM_TASKS"] = "2";
    expect_launch(read(v), Launcher::open_mpi, 3, 4, 3, 4);
}

TEST(LaunchEnvironment, SrunWithPmixTakesTheWorldAndNodeFromSlurm) {
    expect_launch(read(srun_task_6({{"PMIX_RANK", "6"}})), Launcher::pmix, 6, 8, 2, 4);
}

TEST(LaunchEnvironment, SrunWithPmi2) {
    expect_launch(read(srun_task_6({{"PMI_RANK", "6"}, {"PMI_SIZE", "8"}, {"PMI_FD", "11"}})), Launcher::pmi, 6, 8, 2, 4);
}

TEST(LaunchEnvironment, HydraGivesNodeLocalRanks) {
    expect_launch(read({{"PMI_RANK", "3"}, {"PMI_SIZE", "6"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "3"}}), Launcher::pmi, 3, 6, 0, 3);
}

TEST(LaunchEnvironment, PmixOutsideSlurmLeavesTheWorldUnknown) {
    const LaunchEnvironment launch = read({{"PMIX_RANK", "2"}});
    expect_launch(launch, Launcher::pmix, 2, 0, 0, 0);
    EXPECT_NO_THROW(check_mpi_world_matches(launch, 7));
}

TEST(LaunchEnvironment, SrunOfSeveralTasksWithoutPmiIsRefused) {
    try {
        read(srun_task_6({}));
        FAIL() << "srun --mpi=none of 8 tasks was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_NE(std::string(e.what()).find("srun started 8 tasks (SLURM_STEP_NUM_TASKS) without a PMI plugin"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("--mpi=pmix"), std::string::npos) << e.what();
    }
}

TEST(LaunchEnvironment, SrunOfOneTaskWithoutPmiIsOneProcess) {
    Variables v = srun_task_6({});
    v["SLURM_STEP_NUM_TASKS"] = "1";
    EXPECT_FALSE(read(v).needs_mpi());
}

TEST(LaunchEnvironment, MalformedNumberNamesTheVariable) {
    EXPECT_THROW(
        {
            try {
                read({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "two"}});
            } catch (const Error& e) {
                EXPECT_STREQ(e.what(), "environment variable OMPI_COMM_WORLD_RANK='two': expected a whole number (set by the MPI or Slurm launcher)");
                throw;
            }
        },
        Error);
}

TEST(SlurmTasksOnNode, CompressedListsCountNodesInOrder) {
    EXPECT_EQ(slurm_tasks_on_node("8", 0), 8);
    EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 0), 4);
    EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 1), 4);
    EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 2), 3);
    EXPECT_EQ(slurm_tasks_on_node("2,1(x3),5", 4), 5);
    EXPECT_EQ(slurm_tasks_on_node("2,1(x3),5", 3), 1);
}

TEST(SlurmTasksOnNode, MalformedOrTooShortListIsAConfigError) {
    for (const char* text : {"", "4(x2", "4(x)", "x,3", "4(x2),3"}) {
        try {
            slurm_tasks_on_node(text, 3);
            FAIL() << "'" << text << "' gave a count for node 3";
        } catch (const Error& e) {
            EXPECT_EQ(e.kind(), ErrorKind::config);
            EXPECT_NE(std::string(e.what()).find(std::string("SLURM_STEP_TASKS_PER_NODE='") + text + "'"), std::string::npos) << e.what();
        }
    }
}

TEST(CheckMpiWorld, SingletonWorldUnderAManyTaskLauncherIsRefused) {
    LaunchEnvironment launch;
    launch.launcher = Launcher::pmi, launch.world_size = 8;
    EXPECT_NO_THROW(check_mpi_world_matches(launch, 8));
    try {
        check_mpi_world_matches(launch, 1);
        FAIL() << "a world of 1 under an 8-task launch was accepted";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::config);
        EXPECT_NE(std::string(e.what()).find("the launcher started 8 ranks but MPI sees a world of 1"), std::string::npos) << e.what();
    }
}
