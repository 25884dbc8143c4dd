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

std::optional<ResumePoint> find_resume_point(const std::string& mode, const Config& config, bool report, const ProblemOf& problem_of,
                                             const std::optional<std::string>& run_id) {
    const std::optional<std::string> path = find_resume_checkpoint(
        config.checkpoint.dir, mode, [&](const std::string& why) { if (report) log_warn("--resume ", mode, ": ", why); }, problem_of, run_id);
    if (!path) {
        if (report) log_info("--resume ", mode, ": no checkpoint under '", config.checkpoint.dir, "'; starting at step 0");
        return std::nullopt;
    }
    return ResumePoint{*path, read_checkpoint_manifest(*path)};
}

namespace {
Config saved_config(const ResumePoint& resume) {
    return parse_config(resume.manifest.config_toml, resume.path + "/manifest.json (config)", {}, DataFiles::unchecked);
}

// A resume states another global batch only by giving train.global_batch_size or
// train.grad_accum (in its file or a --set) with another value than the saved run had. A key
// left to its default is no statement: a run saved with --set train.global_batch_size=8 and
// resumed on the nodes that are left, from the same file without that --set, keeps 8.
bool restates_global_batch(const TrainConfig& saved, const Config& now) {
    return (now.states("train.global_batch_size") && now.train.global_batch_size != saved.global_batch_size) ||
           (now.states("train.grad_accum") && now.train.grad_accum != saved.grad_accum);
}
}  // namespace

int64_t saved_global_batch(const ResumePoint& resume) {
    if (resume.manifest.global_batch > 0) return resume.manifest.global_batch;
    const TrainConfig t = saved_config(resume).train;
    if (t.global_batch_size > 0) return t.global_batch_size;
    return t.batch_size * std::max<int64_t>(t.grad_accum, 1) * resume.manifest.dp;
}

void keep_saved_global_batch(const ResumePoint& resume, Config& config, int64_t dp, bool report) {
    const int64_t saved = saved_global_batch(resume);
    TrainConfig& t = config.train;
    if (restates_global_batch(saved_config(resume).train, config)) {
        const int64_t now = t.global_batch_size > 0 ? t.global_batch_size : t.batch_size * std::max<int64_t>(t.grad_accum, 1) * dp;
        if (report && now != saved)
            log_warn("resuming '", resume.path, "' with another global batch: ", saved, " -> ", now,
                     " sequences per step (this config states train.global_batch_size or train.grad_accum anew)");
        return;
    }
    if (saved % (t.batch_size * dp) != 0)
        fail(ErrorKind::config, "train.global_batch_size: the checkpoint '", resume.path, "' trained with a global batch of ", saved,
             " sequences per step, which does not split into micro-batches of train.batch_size = ", t.batch_size, " on dp = ", dp,
             " ranks; resume on a layout whose dp x batch_size divides ", saved, ", or change the global batch deliberately (--set train.global_batch_size=N)");
    t.global_batch_size = saved;
    t.grad_accum = 0;
    if (report && dp != resume.manifest.dp)
        log_info("resume: keeping the checkpoint's global batch of ", saved, " sequences per step: grad_accum ", saved / (t.batch_size * dp), " on dp ", dp,
                 " (saved on dp ", resume.manifest.dp, ")");
}

bool trained_already(const std::optional<ResumePoint>& resume, const Config& config, bool report) {
    if (!resume || resume->manifest.step < config.train.steps) return false;
    if (report)
        log_info("'", resume->path, "' is at step ", resume->manifest.step, ": train.steps = ", config.train.steps,
                 " is reached already, nothing to train (raise train.steps to train on)");
    return true;
}

}  // namespace llmtrain
