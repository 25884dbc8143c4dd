// Collective bandwidth over a Comm, measured as nccl-tests does: for a message of S bytes
// and time t per operation on n ranks, algbw = S / t and the bus bandwidth, which is
// comparable across rank counts and with the links' speed, is
//   all_reduce:     busbw = algbw * 2 (n - 1) / n
//   reduce_scatter: busbw = algbw * (n - 1) / n    (S: the whole input, n pieces)
//   all_gather:     busbw = algbw * (n - 1) / n    (S: the whole output, n pieces)
// On one rank nothing crosses a link: the times are local copies (or nothing at all) and
// busbw is 0 by the formulas; the figures say nothing about the interconnect.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace llmtrain {

enum class CollectiveOp { all_reduce, reduce_scatter, all_gather };
const char* collective_name(CollectiveOp op);
double bus_bandwidth_factor(CollectiveOp op, int ranks);

struct CommBenchOptions {
    std::vector<CollectiveOp> ops;
    size_t min_bytes = 1024;
    size_t max_bytes = 64u << 20;
    int warmup = 5;
    int iterations = 20;
    DType dtype = DType::f32;
    Device device = Device::cpu;
};

struct CommBenchRow {
    CollectiveOp op;
    size_t bytes;       // S as above
    int64_t count;      // elements per rank in the call
    double seconds;     // mean time per operation, slowest rank
    double algbw_gbps, busbw_gbps;
};

// allocate(bytes) returns memory of options.device (zeroed or not: the values do not matter).
using BenchAllocator = std::function<std::shared_ptr<void>(size_t bytes)>;

// Sizes double from min_bytes to max_bytes (rounded to whole elements divisible by the rank
// count). Every rank must call it with the same options; each row is reported by all.
// `host` (the same ranks, on host memory) agrees on the slowest rank's time: a GPU
// communicator such as NCCL carries only device memory.
std::vector<CommBenchRow> run_comm_bench(Comm& comm, Comm& host, const CommBenchOptions& options, const BenchAllocator& allocate,
                                         const std::function<void(const CommBenchRow&)>& on_row);

}  // namespace llmtrain
