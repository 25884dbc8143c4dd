#include "cli/run_directory.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "core/signals.h"

namespace llmtrain {

namespace fs = std::filesystem;

std::string default_run_dir(const std::string& config_path) {
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    return cat("runs/", fs::path(config_path).stem().string(), "-", stamp);
}

namespace {
// The command line as the user typed it, for the start record.
std::string command_line() {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!text.empty() && text.back() == '\0') text.pop_back();
    std::replace(text.begin(), text.end(), '\0', ' ');
    return text;
}

std::string host_name() {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    return name;
}

std::string absolute(const std::string& path) {
    std::error_code ec;
    const fs::path full = fs::absolute(path, ec);
    return ec ? path : full.lexically_normal().string();
}
}  // namespace

RunRecord read_run_record(const std::string& dir) {
    RunRecord record;
    std::ifstream in(fs::path(dir) / "log.jsonl");
    if (!in) return record;
    record.holds_run = true;
    for (std::string line; std::getline(in, line);) {
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) continue;  // a line cut by a kill
        const std::string event = j.value("event", "");
        if (event == "step" && j.contains("step") && j.at("step").is_number_integer()) record.last_step = std::max(record.last_step, j.at("step").get<int64_t>());
        if (event != "start" && event != "resume") continue;
        if (j.contains("run_id") && j.at("run_id").is_string()) record.run_id = j.at("run_id").get<std::string>();
        if (j.contains("checkpoint_dir") && j.at("checkpoint_dir").is_string()) record.checkpoint_dir = j.at("checkpoint_dir").get<std::string>();
    }
    return record;
}

void check_run_dir_is_free(const std::string& dir) {
    if (fs::exists(fs::path(dir) / "log.jsonl"))
        fail(ErrorKind::config, "run directory '", dir, "' already holds a run (log.jsonl); continue that run with --resume auto, or choose another --run-dir");
}

RunDirectory::RunDirectory(const std::string& dir, const Config& config, const std::string& config_path, int ranks, const RunIdentity& run) {
    const fs::path log_path = fs::path(dir) / "log.jsonl";
    if (!run.continues_record) {
        check_run_dir_is_free(dir);
        std::error_code ec;
        fs::create_directories(dir, ec);
        if (ec) fail(ErrorKind::io, "cannot create run directory '", dir, "': ", ec.message());
        const std::string config_copy = (fs::path(dir) / "config.toml").string();
        std::ofstream out(config_copy);
        out << "# Effective configuration of this run (defaults and --set overrides applied).\n" << dump_config(config);
        if (!out.flush()) fail(ErrorKind::io, "cannot write '", config_copy, "'");
    }
    log_ = std::make_unique<RunLog>(log_path.string(), run.continues_record);
    install_crash_record(log_->fd());
    set_log_copy((fs::path(dir) / "console.log").string());
    nlohmann::json fields = {{"version", LLMTRAIN_VERSION}, {"command", command_line()}, {"config", config_path}, {"ranks", ranks},
                             {"host", host_name()}, {"pid", static_cast<int64_t>(getpid())}, {"steps", config.train.steps},
                             {"run_id", run.run_id}, {"checkpoint_dir", absolute(config.checkpoint.dir)}};
    if (!run.resumed_from.empty()) fields["resumed_from"] = run.resumed_from;
    if (!run.continues_record) {
        log_->write("start", fields);
        return;
    }
    fields["step"] = run.start_step;
    if (!run.config_changes.empty()) fields["config_changes"] = run.config_changes;
    log_->write("resume", fields);
}

}  // namespace llmtrain
