// NcclComm: the Comm interface over NCCL, on GPU memory, one NCCL communicator per group.
// It is bootstrapped over an existing (MPI) Comm of the same ranks: rank 0 creates the
// unique id and broadcasts it. Operations run on the communicator's own CUDA stream; a
// handle records an event after the operation, and waiting polls that event and NCCL's
// asynchronous error state against a deadline: a failed or hung collective aborts the
// communicator and becomes an error naming the rank and the operation, not a silent hang.
// That host wait per operation suits `bench comm`, which times each one; training enqueues
// its collectives through make_nccl_collectives (stream_collectives.h) under an
// EventOrderedComm, where the host never waits.
//
// In a build without CUDA these functions refuse with an "unsupported" error.
#pragma once

#include <memory>
#include <string>

#include "parallel/comm.h"
#include "parallel/comm_bench.h"

namespace llmtrain {

// A communicator over the same ranks as `bootstrap`, on GPU local_rank % device count.
std::unique_ptr<Comm> make_nccl_comm(Comm& bootstrap, int local_rank, double timeout_seconds);
// "NCCL 2.28.3", or why there is none.
std::string nccl_library_version();
// cudaMalloc'd buffers for the communication benchmark.
BenchAllocator cuda_bench_allocator();

}  // namespace llmtrain
