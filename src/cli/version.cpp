#include "cli/version.h"

#include "backend/backend.h"
#include "core/error.h"
#include "git_commit.h"
#include "parallel/mpi_comm.h"
#include "parallel/nccl_comm.h"

namespace llmtrain {

namespace {
// HDF5's version comes from the build (the checkpoint layer alone includes hdf5.h).
std::string hdf5_library_version() {
#ifdef LLMTRAIN_HDF5_VERSION
    return "HDF5 " LLMTRAIN_HDF5_VERSION;
#else
    return "not built";
#endif
}
}  // namespace

std::string version_text() {
    return cat("llmtrain ", LLMTRAIN_VERSION, " (commit ", LLMTRAIN_GIT_COMMIT, ")\n",
               "CUDA: ", cuda_runtime_version(), "\n",
               "NCCL: ", nccl_library_version(), "\n",
               "MPI: ", mpi_library_version(), "\n",
               "BLAS: ", blas_library_version(), "\n",
               "HDF5: ", hdf5_library_version());
}

std::string build_commit() { return LLMTRAIN_GIT_COMMIT; }

}  // namespace llmtrain
