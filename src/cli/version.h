// What `llmtrain --version` prints: the version and the commit the binary was built from,
// and the versions of the libraries it runs on, so that a bug report or a run's log says
// exactly which build produced it.
#pragma once

#include <string>

namespace llmtrain {

// "llmtrain 0.1.0 (commit 1a2b3c4d5e6f)" then one line per library: CUDA runtime, NCCL,
// MPI, BLAS, HDF5 ("not built" for what this build lacks).
std::string version_text();
// The commit the binary was built from ("unknown" outside a git checkout).
std::string build_commit();

}  // namespace llmtrain
