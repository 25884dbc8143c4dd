// A scratch directory that every rank of an MPI test shares: rank 0 makes it, and removes it
// once every rank is done with it.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "parallel/mpi_comm.h"

namespace llmtrain::test {

// A fresh directory named after `prefix`, the same path on every rank.
inline std::string shared_scratch(const std::string& prefix) {
    MpiSession mpi;
    std::string dir;
    if (mpi.world_rank() == 0) {
        std::string pattern = testing::TempDir() + prefix + "_XXXXXX";
        if (!mkdtemp(pattern.data())) ADD_FAILURE() << "cannot create " << pattern;
        dir = pattern;
    }
    return mpi.broadcast_text(0, dir);
}

// Removes it once every rank got here. An all-reduce, not a broadcast: a broadcast's root may
// return before the others arrive, and remove the directory while a rank still reads it.
inline void remove_shared_scratch(const std::string& dir) {
    MpiSession mpi;
    mpi.first_failing_rank(false);
    if (mpi.world_rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace llmtrain::test
