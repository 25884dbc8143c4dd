#include "core/log.h"

#include <cstdio>
#include <mutex>

namespace llmtrain {

namespace {
struct Logger {
    std::mutex mutex;
    LogLevel level = LogLevel::info;
    int rank = -1;
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
    const char* tag = level == LogLevel::warn ? "warning: " : level == LogLevel::error ? "error: " : "";
    if (l.rank >= 0) std::fprintf(stream, "[rank %d] ", l.rank);
    std::fprintf(stream, "%s%s\n", tag, text.c_str());
    std::fflush(stream);
}

}  // namespace llmtrain
