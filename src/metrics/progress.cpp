#include "metrics/progress.h"

#include <cmath>
#include <cstdio>

#include "core/log.h"

namespace llmtrain {

std::string short_count(double value) {
    static constexpr const char* suffixes[] = {"", "K", "M", "G", "T"};
    size_t i = 0;
    while (std::fabs(value) >= 999.5 && i + 1 < std::size(suffixes)) value /= 1000, ++i;
    char text[32];
    const int decimals = i == 0 || std::fabs(value) >= 99.95 ? 0 : std::fabs(value) >= 9.995 ? 1 : 2;
    std::snprintf(text, sizeof text, "%.*f%s", decimals, value, suffixes[i]);
    return text;
}

std::string short_duration(double seconds) {
    const auto s = static_cast<long long>(std::llround(std::max(0.0, seconds)));
    char text[32];
    if (s >= 3600) std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, s / 60 % 60);
    else if (s >= 60) std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
    else std::snprintf(text, sizeof text, "%llds", s);
    return text;
}

ProgressLine::~ProgressLine() { set_status_line(""); }

std::string ProgressLine::text(const StepRecord& s, double seconds_per_step) const {
    const double remaining = static_cast<double>(total_steps_ - s.step) * seconds_per_step;
    return cat("step ", s.step, "/", total_steps_, " | ", short_count(static_cast<double>(tokens_)), " tokens | loss ", fixed(s.loss, 4), " | ",
               short_count(s.tokens_per_second), " tok/s | ETA ", short_duration(remaining));
}

void ProgressLine::after_step(const StepRecord& s) {
    tokens_ += s.tokens;
    // The first step of a process is a warm-up (allocation, caches): the second sets the pace.
    if (s.step <= start_step_ + 2) mean_step_seconds_ = s.step_seconds;
    else mean_step_seconds_ += 0.1 * (s.step_seconds - mean_step_seconds_);
    const auto now = std::chrono::steady_clock::now();
    if (s.step != total_steps_ && now - last_drawn_ < std::chrono::milliseconds(100)) return;
    last_drawn_ = now;
    set_status_line(text(s, mean_step_seconds_));
}

}  // namespace llmtrain
