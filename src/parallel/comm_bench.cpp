#include "parallel/comm_bench.h"

#include <algorithm>
#include <chrono>

namespace llmtrain {

const char* collective_name(CollectiveOp op) {
    switch (op) {
        case CollectiveOp::all_reduce: return "all_reduce";
        case CollectiveOp::reduce_scatter: return "reduce_scatter";
        case CollectiveOp::all_gather: return "all_gather";
    }
    return "?";
}

double bus_bandwidth_factor(CollectiveOp op, int ranks) {
    const double n = ranks;
    return op == CollectiveOp::all_reduce ? 2 * (n - 1) / n : (n - 1) / n;
}

namespace {

CommHandle launch(Comm& comm, CollectiveOp op, const Tensor& whole, const Tensor& piece) {
    switch (op) {
        case CollectiveOp::all_reduce: return comm.all_reduce_async(whole, ReduceOp::sum);
        case CollectiveOp::reduce_scatter: return comm.reduce_scatter_async(piece, whole);
        case CollectiveOp::all_gather: return comm.all_gather_async(whole);
    }
    return {};
}

// Mean seconds per operation on the slowest rank.
double time_op(Comm& comm, Comm& host, CollectiveOp op, const Tensor& whole, const Tensor& piece, const CommBenchOptions& options) {
    for (int i = 0; i < options.warmup; ++i) launch(comm, op, whole, piece).wait();
    host.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < options.iterations; ++i) launch(comm, op, whole, piece).wait();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / options.iterations;
    return host.all_reduce_scalar(seconds, ReduceOp::max);
}

}  // namespace

std::vector<CommBenchRow> run_comm_bench(Comm& comm, Comm& host, const CommBenchOptions& options, const BenchAllocator& allocate,
                                         const std::function<void(const CommBenchRow&)>& on_row) {
    const int n = comm.size();
    const size_t element = dtype_size(options.dtype);
    const size_t unit = element * static_cast<size_t>(n);  // every size splits into n whole pieces
    const size_t largest = std::max(unit, options.max_bytes / unit * unit);
    std::shared_ptr<void> whole_memory = allocate(largest), piece_memory = allocate(largest / static_cast<size_t>(n));
    std::vector<CommBenchRow> rows;
    for (CollectiveOp op : options.ops) {
        for (size_t bytes = std::max(unit, options.min_bytes / unit * unit); bytes <= largest; bytes *= 2) {
            const auto elements = static_cast<int64_t>(bytes / element);
            const Tensor whole(whole_memory.get(), options.dtype, {elements}, options.device);
            const Tensor piece(piece_memory.get(), options.dtype, {elements / n}, options.device);
            const double seconds = time_op(comm, host, op, whole, piece, options);
            const double algbw = static_cast<double>(bytes) / seconds / 1e9;
            const int64_t count = op == CollectiveOp::all_reduce ? elements : elements / n;
            rows.push_back({op, bytes, count, seconds, algbw, algbw * bus_bandwidth_factor(op, n)});
            on_row(rows.back());
        }
    }
    return rows;
}

}  // namespace llmtrain
