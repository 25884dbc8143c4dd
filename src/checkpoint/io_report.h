// What a save or a resume cost in storage traffic, per rank and over the job: the figures each
// save and each resume logs (bytes per rank, max and mean, seconds, GB/s).
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/manifest.h"
#include "parallel/comm.h"

namespace llmtrain {

// Bytes this thread has read through the kernel since the counter was made (/proc's rchar
// of the thread: every read() and pread(), file data and metadata alike; 0 where /proc is
// not readable).
class StorageCounter {
public:
    StorageCounter();
    uint64_t bytes_read() const;

private:
    uint64_t start_;
};

// One rank's bytes and seconds, agreed over the job.
struct IoFigures {
    double bytes_max = 0, bytes_mean = 0, bytes_total = 0;
    double seconds = 0;  // the slowest rank's
    int ranks = 1;
};
// Three scalar all-reduces over `world`: every rank calls it.
IoFigures agree_io_figures(Comm& world, uint64_t bytes, double seconds);
// "per rank max 10.2 MB, mean 9.9 MB | 79.3 MB in all at 0.152 GB/s (0.019 GB/s per rank)", `what` being read or written.
std::string describe_io(const IoFigures& figures, const char* what);
// The sum of the checkpoint's rank files, as its manifest records them.
uint64_t checkpoint_bytes(const Manifest& manifest);

}  // namespace llmtrain
