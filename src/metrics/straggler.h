// The straggler score: in a synchronous job every rank waits for the slowest at each
// collective, so step times are equal and say nothing; the compute time (step time less the
// waits for communication and data) tells the slow rank. Each rank keeps the compute times
// of its last steps; every metrics.straggler_interval_steps the ranks exchange their medians
// (one small collective) and each rank's score is
//     score_r = min over ranks of median / median_r      (1: as fast as the fastest)
// The median ignores the odd slow step (a checkpoint copy, a page fault storm).
#pragma once

#include <cstddef>
#include <vector>

namespace llmtrain {

class ComputeTimeWindow {
public:
    explicit ComputeTimeWindow(size_t capacity) : capacity_(capacity) {}
    void add(double seconds);
    // 0 while empty.
    double median() const;
    void clear() { times_.clear(), next_ = 0; }

private:
    size_t capacity_;
    std::vector<double> times_;
    size_t next_ = 0;  // the oldest, overwritten next once full
};

// Every rank's score from every rank's median (a rank with no time yet scores 1).
std::vector<double> straggler_scores(const std::vector<double>& medians);

}  // namespace llmtrain
