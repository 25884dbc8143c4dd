#include "cli/restart_report.h"

#include <chrono>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "core/log.h"

namespace llmtrain {

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// /proc/self/stat's field 22 is the start time in clock ticks after boot; /proc/stat's btime
// is the boot's Unix time.
double process_start_unix() {
    std::ifstream stat("/proc/self/stat"), system("/proc/stat");
    std::string text;
    if (!std::getline(stat, text)) return unix_now();
    const size_t after_name = text.rfind(')');  // the command name may hold spaces
    if (after_name == std::string::npos) return unix_now();
    std::istringstream fields(text.substr(after_name + 2));
    std::string field;
    for (int i = 3; i <= 22 && fields >> field; ++i) {
    }
    double boot = 0;
    for (std::string line; std::getline(system, line);)
        if (line.rfind("btime ", 0) == 0) boot = std::stod(line.substr(6));
    const long ticks = sysconf(_SC_CLK_TCK);
    if (boot <= 0 || ticks <= 0 || field.empty()) return unix_now();
    return boot + std::stod(field) / static_cast<double>(ticks);
}

void RestartReport::after_step(const StepRecord&) {
    if (told_) return;
    told_ = true;
    const RestartMarks& m = facts_.marks;
    const double now = unix_now();
    const std::vector<std::pair<std::string, double>> phases = {
        {"launch", m.launched - m.process_start}, {"communicators", m.communicators - m.launched}, {"load", m.loaded - m.communicators}, {"first_step", now - m.loaded}};
    const int64_t lost = facts_.interrupted_step >= 0 ? std::max<int64_t>(0, facts_.interrupted_step - facts_.resumed_step) : -1;
    metrics_.restart(log_ ? lost : -1, phases);
    if (!log_) return;
    nlohmann::json phase_fields = nlohmann::json::object();
    for (const auto& [phase, seconds] : phases) phase_fields[phase] = seconds;
    log_->write("restart", {{"step", facts_.resumed_step}, {"source", facts_.source}, {"path", facts_.path}, {"interrupted_step", facts_.interrupted_step},
                            {"steps_lost", lost}, {"seconds", now - m.process_start}, {"phases", phase_fields}});
    log_info("restart: resumed at step ", facts_.resumed_step, " from the ", facts_.source, lost >= 0 ? cat("; ", lost, " step(s) lost to the failure") : "",
             " | ", fixed(now - m.process_start, 2), " s from process start to the first step: launch ", fixed(phases[0].second, 2), " s, communicators ",
             fixed(phases[1].second, 2), " s, load ", fixed(phases[2].second, 2), " s, first step ", fixed(phases[3].second, 2), " s");
}

}  // namespace llmtrain
