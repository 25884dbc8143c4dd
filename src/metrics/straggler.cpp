#include "metrics/straggler.h"

#include <algorithm>
#include <limits>

namespace llmtrain {

void ComputeTimeWindow::add(double seconds) {
    if (times_.size() < capacity_) {
        times_.push_back(seconds);
        return;
    }
    times_[next_] = seconds;
    next_ = (next_ + 1) % capacity_;
}

double ComputeTimeWindow::median() const {
    if (times_.empty()) return 0;
    std::vector<double> sorted = times_;
    const size_t mid = sorted.size() / 2;
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(mid), sorted.end());
    if (sorted.size() % 2) return sorted[mid];
    const double upper = sorted[mid];
    return (*std::max_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(mid)) + upper) / 2;
}

std::vector<double> straggler_scores(const std::vector<double>& medians) {
    double fastest = std::numeric_limits<double>::infinity();
    for (double m : medians)
        if (m > 0) fastest = std::min(fastest, m);
    std::vector<double> scores;
    for (double m : medians) scores.push_back(m > 0 ? fastest / m : 1.0);
    return scores;
}

}  // namespace llmtrain
