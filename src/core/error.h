// Typed errors with context. Library code throws llmtrain::Error; only main() decides to exit.
// The message always names where the problem is (file, key, tensor, op) and what was expected.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace llmtrain {

enum class ErrorKind {
    config,       // a config key is unknown, mistyped, out of range or inconsistent
    data,         // a data file is missing, empty or malformed
    shape,        // tensors handed to an op do not fit together
    io,           // a file could not be read or written
    unsupported,  // a valid request this build or machine cannot serve
    runtime,      // anything else that went wrong while running
    diverged,     // training health stopped the run (non-finite loss or gradients)
    hardware,     // the device reported a hardware fault (uncorrectable ECC, NVLink): take the node out
    storage,      // checkpoints cannot be saved (space, permissions, a failing mount): fix the storage first
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
public:
    Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
    ErrorKind kind() const { return kind_; }

private:
    ErrorKind kind_;
};

// Concatenates any streamable values: cat("got ", n, " heads").
template <class... Args>
std::string cat(Args&&... args) {
    std::ostringstream out;
    (out << ... << std::forward<Args>(args));
    return out.str();
}

template <class... Args>
[[noreturn]] void fail(ErrorKind kind, Args&&... args) {
    throw Error(kind, cat(std::forward<Args>(args)...));
}

}  // namespace llmtrain
