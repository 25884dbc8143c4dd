#include "core/log.h"

#include <cerrno>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <unistd.h>

namespace llmtrain {

namespace {
struct Logger {
    std::mutex mutex;
    LogLevel level = LogLevel::info;
    int rank = -1;
    std::FILE* copy = nullptr;  // the run's console.log, once there is a run directory
    std::string status;         // the live line on the terminal; empty: none shown
};
// Carriage return, then erase to the end of the line (ANSI): the terminal line is blank again.
constexpr const char* kEraseLine = "\r\033[K";
// Takes the status line off the terminal before a log line, and puts it back after.
struct StatusLineAside {
    explicit StatusLineAside(const std::string& status) : status_(status) {
        if (!status_.empty()) std::fputs(kEraseLine, stdout), std::fflush(stdout);
    }
    ~StatusLineAside() {
        if (!status_.empty()) std::fputs(status_.c_str(), stdout), std::fflush(stdout);
    }
    const std::string& status_;
};
Logger& logger() {
    static Logger instance;
    return instance;
}
}  // namespace

void set_log_level(LogLevel level) { logger().level = level; }
void set_log_rank(int rank) { logger().rank = rank; }

void log_line(LogLevel level, const std::string& text) {
    Logger& l = logger();
    if (level < l.level) return;
    std::lock_guard<std::mutex> lock(l.mutex);
    // Info lines are the program's output (stdout); warnings and errors go to stderr.
    std::FILE* stream = level >= LogLevel::warn ? stderr : stdout;
    // What goes to stderr says which program said it (a job log interleaves several).
    const char* tag = level == LogLevel::warn ? "llmtrain: warning: " : level == LogLevel::error ? "llmtrain: error: " : "";
    const StatusLineAside aside(l.status);
    for (std::FILE* out : {stream, l.copy}) {
        if (!out) continue;
        if (l.rank >= 0) std::fprintf(out, "[rank %d] ", l.rank);
        std::fprintf(out, "%s%s\n", tag, text.c_str());
        std::fflush(out);
    }
}

std::string fixed(double value, int decimals) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
    return buffer;
}

std::string scientific(double value) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.2e", value);
    return buffer;
}

std::string megabytes(double bytes) { return fixed(bytes / 1e6, 1) + " MB"; }

std::string utc_timestamp() {
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm utc{};
    gmtime_r(&now, &utc);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
    return text;
}

void set_log_copy(const std::string& path) {
    std::FILE* file = std::fopen(path.c_str(), "a");
    if (!file) fail(ErrorKind::io, "cannot create '", path, "': ", std::strerror(errno));
    Logger& l = logger();
    std::lock_guard<std::mutex> lock(l.mutex);
    if (l.copy) std::fclose(l.copy);
    l.copy = file;
}

void print_error_line(const std::string& line) {
    Logger& l = logger();
    std::lock_guard<std::mutex> lock(l.mutex);
    const StatusLineAside aside(l.status);
    for (std::FILE* out : {stderr, l.copy}) {
        if (!out) continue;
        std::fprintf(out, "%s\n", line.c_str());
        std::fflush(out);
    }
}

}  // namespace llmtrain

namespace llmtrain {

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

void set_status_line(const std::string& text) {
    Logger& l = logger();
    std::lock_guard<std::mutex> lock(l.mutex);
    if (text.empty() && l.status.empty()) return;
    l.status = text;
    std::fputs(kEraseLine, stdout);
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
}

}  // namespace llmtrain
