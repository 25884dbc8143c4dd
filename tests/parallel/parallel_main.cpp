// The parallel tests run under `mpirun -np N`: MPI is initialized once around the whole
// GoogleTest run, and every rank runs every selected test.
#include <gtest/gtest.h>

#include "parallel/mpi_comm.h"

int main(int argc, char** argv) {
    llmtrain::MpiSession mpi;
    ::testing::InitGoogleTest(&argc, argv);
    // Only rank 0 prints the results: the ranks run the same tests in lock step.
    if (mpi.world_rank() != 0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
    }
    return RUN_ALL_TESTS();
}
