#include "cli/run_directory.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "core/signals.h"

namespace llmtrain {

std::string default_run_dir(const std::string& config_path) {
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    return cat("runs/", std::filesystem::path(config_path).stem().string(), "-", stamp);
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
}  // namespace

void check_run_dir_is_free(const std::string& dir) {
    if (std::filesystem::exists(std::filesystem::path(dir) / "log.jsonl"))
        fail(ErrorKind::config, "run directory '", dir, "' already holds a run (log.jsonl); choose another --run-dir");
}

RunDirectory::RunDirectory(const std::string& dir, const Config& config, const std::string& config_path, int ranks) {
    namespace fs = std::filesystem;
    check_run_dir_is_free(dir);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) fail(ErrorKind::io, "cannot create run directory '", dir, "': ", ec.message());
    const std::string config_copy = (fs::path(dir) / "config.toml").string();
    std::ofstream out(config_copy);
    out << "# Effective configuration of this run (defaults and --set overrides applied).\n" << dump_config(config);
    if (!out.flush()) fail(ErrorKind::io, "cannot write '", config_copy, "'");
    log_ = std::make_unique<RunLog>((fs::path(dir) / "log.jsonl").string());
    install_crash_record(log_->fd());
    set_log_copy((fs::path(dir) / "console.log").string());
    log_->write("start", {{"version", LLMTRAIN_VERSION}, {"command", command_line()}, {"config", config_path}, {"ranks", ranks},
                          {"host", host_name()}, {"pid", static_cast<int64_t>(getpid())}, {"steps", config.train.steps}});
}

}  // namespace llmtrain
