#include "checkpoint/io_report.h"

#include <algorithm>
#include <fstream>
#include <string>

#include "core/log.h"

namespace llmtrain {

namespace {
uint64_t thread_rchar() {
    std::ifstream io("/proc/thread-self/io");
    std::string key;
    uint64_t value = 0;
    while (io >> key >> value)
        if (key == "rchar:") return value;
    return 0;
}

std::string gbps(double bytes, double seconds) {
    const double rate = bytes / 1e9 / std::max(seconds, 1e-9);
    return fixed(rate, rate < 1 ? 3 : 2);
}
}  // namespace

StorageCounter::StorageCounter() : start_(thread_rchar()) {}

uint64_t StorageCounter::bytes_read() const { return thread_rchar() - start_; }

IoFigures agree_io_figures(Comm& world, uint64_t bytes, double seconds) {
    IoFigures f;
    f.ranks = world.size();
    const auto mine = static_cast<double>(bytes);
    f.bytes_max = world.size() == 1 ? mine : world.all_reduce_scalar(mine, ReduceOp::max);
    f.bytes_total = world.size() == 1 ? mine : world.all_reduce_scalar(mine, ReduceOp::sum);
    f.bytes_mean = f.bytes_total / f.ranks;
    f.seconds = world.size() == 1 ? seconds : world.all_reduce_scalar(seconds, ReduceOp::max);
    return f;
}

std::string describe_io(const IoFigures& f, const char* what) {
    return cat(what, " per rank max ", megabytes(f.bytes_max), ", mean ", megabytes(f.bytes_mean), " | ", megabytes(f.bytes_total), " in all at ",
               gbps(f.bytes_total, f.seconds), " GB/s (", gbps(f.bytes_max, f.seconds), " GB/s on the busiest rank)");
}

uint64_t checkpoint_bytes(const Manifest& manifest) {
    uint64_t total = 0;
    for (const CheckpointFile& f : manifest.files) total += f.bytes;
    return total;
}

}  // namespace llmtrain
