#include "checkpoint/resume_point.h"

#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/config_changes.h"
#include "core/log.h"

namespace llmtrain {

void check_resume_config(const ResumePoint& resume, const Config& config, bool report) {
    const ConfigChanges changes = config_changes(resume.manifest.config_toml, dump_config(config));
    if (!changes.model_shape.empty()) {
        const ConfigChange& c = changes.model_shape.front();
        fail(ErrorKind::config, c.key, ": the checkpoint '", resume.path, "' was saved by a model with ", c.key, " = ", c.saved, ", this config has ", c.now,
             " (a resumed model must have the same shape; ", changes.model_shape.size(), " model key(s) differ)");
    }
    if (!report) return;
    const auto listed = [](const std::vector<ConfigChange>& list) {
        std::string text;
        for (const ConfigChange& c : list) text += (text.empty() ? "" : ", ") + c.describe();
        return text;
    };
    if (!changes.layout.empty()) log_info("resuming on another layout: ", listed(changes.layout));
    if (!changes.other.empty()) log_warn("resuming '", resume.path, "' with a changed config: ", listed(changes.other));
}

std::optional<ResumePoint> find_resume_point(const std::string& mode, const Config& config, bool report, const ProblemOf& problem_of) {
    const std::optional<std::string> path = find_resume_checkpoint(
        config.checkpoint.dir, mode, [&](const std::string& why) { if (report) log_warn("--resume ", mode, ": ", why); }, problem_of);
    if (!path) {
        if (report) log_info("--resume ", mode, ": no checkpoint under '", config.checkpoint.dir, "'; starting at step 0");
        return std::nullopt;
    }
    return ResumePoint{*path, read_checkpoint_manifest(*path)};
}

bool trained_already(const std::optional<ResumePoint>& resume, const Config& config, bool report) {
    if (!resume || resume->manifest.step < config.train.steps) return false;
    if (report)
        log_info("'", resume->path, "' is at step ", resume->manifest.step, ": train.steps = ", config.train.steps,
                 " is reached already, nothing to train (raise train.steps to train on)");
    return true;
}

}  // namespace llmtrain
