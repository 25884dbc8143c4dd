// The logger: the one global of the project. Lines go to stderr with a level and, once
// known, the rank; the step log line itself goes to stdout through log_info.
#pragma once

#include <string>

#include "core/error.h"

namespace llmtrain {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };

void set_log_level(LogLevel level);
void set_log_rank(int rank);  // -1: single process, no rank prefix
void log_line(LogLevel level, const std::string& text);
// Also appends every line from now on to path (a run's console.log); throws Error(io) if it
// cannot be created.
void set_log_copy(const std::string& path);
// A live line at the bottom of the terminal (progress), redrawn in place; log lines print
// above it. Only where stdout is a terminal, never into the copy; "" removes it.
void set_status_line(const std::string& text);
bool stdout_is_terminal();
// An error line exactly as given ("llmtrain: config error: ..."), on stderr and in the copy.
void print_error_line(const std::string& line);

// value with a fixed number of decimals ("3.1416"), and in scientific notation ("3.00e-04").
std::string fixed(double value, int decimals);
std::string scientific(double value);
// bytes in megabytes with one decimal: "12.3 MB".
std::string megabytes(double bytes);
// The current UTC time to the second, ISO 8601: "2026-12-06T21:55:46Z".
std::string utc_timestamp();

template <class... Args> void log_info(Args&&... args) { log_line(LogLevel::info, cat(std::forward<Args>(args)...)); }
template <class... Args> void log_warn(Args&&... args) { log_line(LogLevel::warn, cat(std::forward<Args>(args)...)); }
template <class... Args> void log_debug(Args&&... args) { log_line(LogLevel::debug, cat(std::forward<Args>(args)...)); }

}  // namespace llmtrain
