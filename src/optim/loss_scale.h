// Dynamic loss scaling for fp16 compute (Micikevicius et al. 2018): the loss is multiplied
// by a scale before backward so small gradients stay above fp16's underflow; the gradients
// are divided by it again in the update. An overflow (non-finite gradients) halves the scale
// and the step is skipped; `window` steps in a row without one double it. Without fp16 the
// scale is 1 and never changes.
#pragma once

#include <algorithm>
#include <cstdint>

namespace llmtrain {

class DynamicLossScale {
public:
    static constexpr double max_scale = 16777216;  // 2^24

    DynamicLossScale() = default;  // fixed at 1
    DynamicLossScale(double initial, int64_t window) : scale_(initial), window_(window), dynamic_(true) {}

    double scale() const { return scale_; }
    bool dynamic() const { return dynamic_; }
    int64_t good_steps() const { return good_steps_; }
    // A resumed run continues with the saved scale and count.
    void restore(double scale, int64_t good_steps) {
        if (!dynamic_) return;
        scale_ = scale;
        good_steps_ = good_steps;
    }
    // After a step: whether its gradients overflowed.
    void update(bool overflow) {
        if (!dynamic_) return;
        if (overflow) {
            scale_ = std::max(1.0, scale_ / 2);
            good_steps_ = 0;
        } else if (++good_steps_ >= window_) {
            scale_ = std::min(max_scale, scale_ * 2);
            good_steps_ = 0;
        }
    }

private:
    double scale_ = 1;
    int64_t window_ = 0;
    bool dynamic_ = false;
    int64_t good_steps_ = 0;  // since the scale last changed
};

}  // namespace llmtrain
