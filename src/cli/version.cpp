#include "cli/version.h"

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cudnn/cudnn_api.h"
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
// cuDNN is loaded at run time (backend/cudnn/cudnn_api.h), not linked: whether it loads here,
// and why not, is what a run's attention = "auto" will find. Loading needs no GPU or driver.
std::string cudnn_library_version() {
    if (!cuda_backend_built()) return "not used (CUDA not built)";
    std::string why_not;
    const std::unique_ptr<cudnn::Library> library = cudnn::Library::load(why_not);
    return library ? cat("cuDNN ", library->version(), " (", library->path(), ")") : cat("not loaded: ", why_not);
}
}  // namespace

std::string version_text() {
    return cat("llmtrain ", LLMTRAIN_VERSION, " (commit ", LLMTRAIN_GIT_COMMIT, ")\n",
               "CUDA: ", cuda_runtime_version(), "\n",
               "NCCL: ", nccl_library_version(), "\n",
               "MPI: ", mpi_library_version(), "\n",
               "BLAS: ", blas_library_version(), "\n",
               "HDF5: ", hdf5_library_version(), "\n",
               "cuDNN: ", cudnn_library_version());
}

std::string build_commit() { return LLMTRAIN_GIT_COMMIT; }

}  // namespace llmtrain
