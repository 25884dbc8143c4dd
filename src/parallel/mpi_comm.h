// MPI: whether a launcher started this process, and the process-wide MPI session. The
// MpiComm groups of a run are made by make_mpi_context (parallel/context.h).
#pragma once

#include <string>

namespace llmtrain {

// "Open MPI v4.1.4, ..." as the library reports itself (first line).
std::string mpi_library_version();

// Whether this process was started by an MPI launcher (mpirun, srun with PMI/PMIx; see
// parallel/launch_env.h, which also refuses srun without PMI).
// Without one, llmtrain runs as a single process and never initializes MPI.
bool launched_by_mpi();

// MPI_Init_thread on construction (if not initialized yet), MPI_Finalize on destruction.
class MpiSession {
public:
    MpiSession();
    ~MpiSession();
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;
    int world_rank() const;
    int world_size() const;
    // The lowest world rank on which failed is true, or -1; the same answer on every rank
    // (a collective over the world).
    int first_failing_rank(bool failed) const;
    // root's value, on every rank (a collective over the world).
    int broadcast_from(int root, int value) const;
    std::string broadcast_text(int root, std::string text) const;
    // Ends every rank of the job (MPI_Abort): one failed rank must not leave others waiting.
    [[noreturn]] static void abort_job(int exit_code);

private:
    bool owns_ = false;
};

}  // namespace llmtrain
