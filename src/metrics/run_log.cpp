#include "metrics/run_log.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <unistd.h>

#include "core/error.h"

namespace llmtrain {

namespace {
// "2026-11-23T23:59:01.123Z": UTC, milliseconds.
std::string utc_timestamp() {
    const auto now = std::chrono::system_clock::now();
    const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
    const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    char text[40];
    const size_t n = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
    std::snprintf(text + n, sizeof text - n, ".%03dZ", static_cast<int>(millis));
    return text;
}
// One line of log.jsonl: the event, its fields and the wall-clock time (UTC).
std::string record_line(const std::string& event, const nlohmann::json& fields) {
    nlohmann::json record = {{"event", event}};
    record.update(fields);
    record["time"] = utc_timestamp();
    return record.dump() + "\n";
}
}  // namespace

RunLog::RunLog(const std::string& path, bool append) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | (append ? 0 : O_EXCL) | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(ErrorKind::io, "cannot ", append ? "open" : "create", " '", path, "': ", std::strerror(errno));
}

RunLog::~RunLog() {
    if (fd_ >= 0) ::close(fd_);
}

void RunLog::write(const std::string& event, nlohmann::json fields) {
    const std::string line = record_line(event, fields);
    // One write() per record: O_APPEND keeps a line whole even next to the crash handler's.
    const ssize_t written = ::write(fd_, line.data(), line.size());
    if (written != static_cast<ssize_t>(line.size()))
        fail(ErrorKind::io, "cannot write '", path_, "': ", written < 0 ? std::strerror(errno) : "short write");
}

bool RunLog::append_to(const std::string& path, const std::string& event, nlohmann::json fields) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) return false;
    const std::string line = record_line(event, fields);
    const bool written = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ::close(fd);
    return written;
}

namespace {
// MoE: per layer (global index) its expert load, max over mean, and the share dropped; the
// balancing losses.
nlohmann::json moe_fields(const StepRecord& s) {
    nlohmann::json layers = nlohmann::json::array(), load = nlohmann::json::array(), dropped = nlohmann::json::array(), share = nlohmann::json::array();
    for (const MoeLayerRecord& l : s.moe) {
        layers.push_back(l.layer);
        load.push_back(l.load_max_over_mean);
        dropped.push_back(l.dropped_fraction);
        share.push_back(l.top_expert_token_share);
    }
    return {{"layers", layers}, {"load_max_over_mean", load}, {"dropped_fraction", dropped}, {"top_expert_token_share", share}, {"balance_loss", s.balance_loss}};
}
}  // namespace

void RunLog::after_step(const StepRecord& s) {
    nlohmann::json fields = {{"step", s.step},         {"loss", s.loss},         {"lr", s.lr},
                             {"grad_norm", s.grad_norm}, {"step_ms", s.step_seconds * 1e3}, {"tokens_per_second", s.tokens_per_second},
                             {"skipped", s.skipped}, {"dp_bytes_sent", s.dp_bytes_sent}, {"host_syncs", s.rank.host_syncs}};
    if (s.dynamic_loss_scale) fields["loss_scale"] = s.loss_scale;
    if (s.samples_replaced > 0) fields["samples_replaced"] = s.samples_replaced;
    if (!s.moe.empty()) fields["moe"] = moe_fields(s);
    if (s.fp8) fields["fp8"] = {{"saturated", s.fp8_saturated}, {"flushed", s.fp8_flushed}};
    write("step", fields);
}

void RunLog::after_corrupt_block(const CorruptBlockRecord& c) {
    write("corrupt_block", {{"step", c.step}, {"shard", c.shard}, {"block", c.block}, {"first_token", c.first_token}, {"tokens_lost", c.tokens},
                            {"samples_replaced", c.samples_replaced}});
}

void RunLog::after_eval(const EvalRecord& e) { write("eval", {{"step", e.step}, {"val_loss", e.val_loss}}); }

}  // namespace llmtrain
